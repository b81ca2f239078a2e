package portal

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// MaxLinkTTL is the longest validity Link accepts.
const MaxLinkTTL = 7 * 24 * time.Hour

// ErrNoLinkKeys is returned by Link when Config.LinkKeys is empty.
var ErrNoLinkKeys = errors.New("txhook: portal: Config.LinkKeys is not set, so the portal makes no access links")

// ErrInvalidTenant is returned for an empty tenant or one longer than 255
// bytes.
var ErrInvalidTenant = errors.New("txhook: portal: invalid tenant")

// Purposes of a signed token: a link or a session cookie. Signed with a
// different label each, so one cannot stand in for the other.
const (
	purposeLink    = "txhook-portal-link"
	purposeSession = "txhook-portal-session"
	tokenVersion   = 1
	nonceLen       = 16
)

// signed is what a link or session token carries.
type signed struct {
	tenant  string
	expires time.Time
}

// sign returns base64url(version | expiry | nonce | tenant) "." base64url(mac).
func (p *Portal) sign(purpose, tenant string, expires time.Time) (string, error) {
	if tenant == "" || len(tenant) > 255 {
		return "", ErrInvalidTenant
	}
	msg := make([]byte, 1+8+nonceLen, 1+8+nonceLen+len(tenant))
	msg[0] = tokenVersion
	binary.BigEndian.PutUint64(msg[1:9], uint64(expires.Unix()))
	if _, err := rand.Read(msg[9 : 9+nonceLen]); err != nil {
		return "", err
	}
	msg = append(msg, tenant...)
	mac := macOf(p.cfg.LinkKeys[0], purpose, msg)
	return base64.RawURLEncoding.EncodeToString(msg) + "." + base64.RawURLEncoding.EncodeToString(mac), nil
}

func macOf(key []byte, purpose string, msg []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(purpose))
	m.Write([]byte{0})
	m.Write(msg)
	return m.Sum(nil)
}

// errBadToken is all a refused token says, whatever was wrong with it.
var errBadToken = errors.New("invalid or expired access token")

// verify checks a token against every key and its expiry.
func (p *Portal) verify(purpose, tok string, now time.Time) (signed, error) {
	var msgPart, macPart string
	for i := 0; i < len(tok); i++ {
		if tok[i] == '.' {
			msgPart, macPart = tok[:i], tok[i+1:]
			break
		}
	}
	msg, err1 := base64.RawURLEncoding.DecodeString(msgPart)
	mac, err2 := base64.RawURLEncoding.DecodeString(macPart)
	if err1 != nil || err2 != nil || len(msg) <= 1+8+nonceLen || msg[0] != tokenVersion || len(mac) != sha256.Size {
		return signed{}, errBadToken
	}
	ok := false
	for _, k := range p.cfg.LinkKeys {
		// Every key is tried, so the time taken does not say which matched.
		if hmac.Equal(mac, macOf(k, purpose, msg)) {
			ok = true
		}
	}
	if !ok {
		return signed{}, errBadToken
	}
	exp := time.Unix(int64(binary.BigEndian.Uint64(msg[1:9])), 0)
	if !now.Before(exp) {
		return signed{}, errBadToken
	}
	return signed{tenant: string(msg[1+8+nonceLen:]), expires: exp}, nil
}

// Link returns a URL path (Prefix + "link?token=...") that opens the
// portal for tenant for ttl (at most MaxLinkTTL): whoever opens it gets a
// session cookie for that tenant, valid until the link would have expired
// or Config.SessionTTL after opening it, whichever comes first, and is
// redirected to the endpoints page, whose URL carries no token. The token
// is HMAC-SHA256 signed with the first of Config.LinkKeys; taking a key
// out of LinkKeys revokes every link and session it signed. Prepend the
// host's origin to hand it out. A link can be opened more than once while
// it is valid: keep ttl short (minutes) and hand it over a channel only
// the merchant reads.
func (p *Portal) Link(tenant string, ttl time.Duration) (string, error) {
	if len(p.cfg.LinkKeys) == 0 {
		return "", ErrNoLinkKeys
	}
	if ttl <= 0 || ttl > MaxLinkTTL {
		return "", fmt.Errorf("txhook: portal: link ttl %v outside (0, %v]", ttl, MaxLinkTTL)
	}
	tok, err := p.sign(purposeLink, tenant, p.now().Add(ttl))
	if err != nil {
		return "", err
	}
	return p.cfg.Prefix + "link?token=" + url.QueryEscape(tok), nil
}

// sessionCookie names the session cookie of r: a __Host- one over TLS.
func (p *Portal) sessionCookie(r *http.Request) string {
	if p.proxies.OverTLS(r) {
		return "__Host-txhook_portal"
	}
	return "txhook_portal"
}

// redeem checks a link's token and answers with the session cookie and a
// redirect to a URL without the token, or a 403 page that says nothing
// about what was wrong.
func (p *Portal) redeem(w http.ResponseWriter, r *http.Request) {
	now := p.now()
	s, err := p.verify(purposeLink, r.URL.Query().Get("token"), now)
	if err != nil {
		p.log.Info("txhook: portal refused an access link", "remote", p.proxies.ClientAddr(r))
		p.fail(w, r, "", http.StatusForbidden, "err.link")
		return
	}
	exp := earlier(s.expires, now.Add(p.cfg.SessionTTL))
	tok, err := p.sign(purposeSession, s.tenant, exp)
	if err != nil {
		p.internal(w, r, err)
		return
	}
	// MaxAge, not Expires: relative, so the browser's clock does not matter.
	c := &http.Cookie{Name: p.sessionCookie(r), Value: tok, Path: p.cfg.Prefix, MaxAge: max(int(exp.Sub(now)/time.Second), 1), HttpOnly: true, SameSite: http.SameSiteLaxMode}
	if c.Name != "txhook_portal" {
		c.Path, c.Secure = "/", true
	}
	http.SetCookie(w, c)
	http.Redirect(w, r, p.cfg.Prefix+"endpoints", http.StatusSeeOther)
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
