package signer_test

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/txhook/txhook/signer"
)

func ExampleStandard_Sign() {
	h := http.Header{}
	err := signer.Standard{}.Sign(h, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0),
		[]byte(`{"test": 2432232314}`), []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"})
	if err != nil {
		panic(err)
	}
	fmt.Println("webhook-id:", h.Get("webhook-id"))
	fmt.Println("webhook-timestamp:", h.Get("webhook-timestamp"))
	fmt.Println("webhook-signature:", h.Get("webhook-signature"))
	// Output:
	// webhook-id: msg_p5jXN8AQM9LWM0D4loKWxJek
	// webhook-timestamp: 1614265330
	// webhook-signature: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
}

func ExampleStandard_Verify() {
	// What a sender put on the request.
	h := http.Header{}
	h.Set("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek")
	h.Set("webhook-timestamp", "1614265330")
	h.Set("webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
	body := []byte(`{"test": 2432232314}`)

	// A fixed clock for the example; leave Now nil in real code.
	v := signer.Standard{Now: func() time.Time { return time.Unix(1614265330+42, 0) }}
	secrets := []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}

	msg, err := v.Verify(h, body, secrets)
	fmt.Println(msg.ID, msg.Timestamp.Format(time.RFC3339), err)

	_, err = v.Verify(h, []byte(`{"test": 1}`), secrets)
	fmt.Println(errors.Is(err, signer.ErrNoMatchingSignature))
	// Output:
	// msg_p5jXN8AQM9LWM0D4loKWxJek 2021-02-25T15:02:10Z <nil>
	// true
}

// Rotating a secret: sign with the old and the new one while receivers move
// over; each signature verifies on its own.
func ExampleStandard_rotation() {
	oldSecret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	newSecret := "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
	h := http.Header{}
	ts := time.Unix(1614265330, 0)
	if err := (signer.Standard{}).Sign(h, "msg_1", ts, []byte("{}"), []string{oldSecret, newSecret}); err != nil {
		panic(err)
	}
	fmt.Println(h.Get("webhook-signature"))

	v := signer.Standard{Now: func() time.Time { return ts }}
	_, errOld := v.Verify(h, []byte("{}"), []string{oldSecret})
	_, errNew := v.Verify(h, []byte("{}"), []string{newSecret})
	fmt.Println(errOld, errNew)
	// Output:
	// v1,ZztYR0IIDCBCUcYzh8ZE+qsQWpIgtHU7R1hpe8htaD4= v1,7x4b0NlBAXvf6A1S9ZdaACO1rGiQqSydBK3FJ5b4ZOI=
	// <nil> <nil>
}

// Asymmetric signatures: the sender keeps the whsk_ key, receivers get the
// whpk_ key, which cannot sign.
func ExampleGenerateKeyPair() {
	private, public, err := signer.GenerateKeyPair()
	if err != nil {
		panic(err)
	}
	h := http.Header{}
	now := time.Now()
	if err := (signer.Standard{}).Sign(h, "msg_1", now, []byte("{}"), []string{private}); err != nil {
		panic(err)
	}
	_, err = signer.Standard{}.Verify(h, []byte("{}"), []string{public})
	fmt.Println(h.Get("webhook-signature")[:4], err)
	// Output: v1a, <nil>
}

func ExampleStripe() {
	s := signer.Stripe{Header: "X-Kxp-Signature"}
	secret := "7c4b3a9e2f1d8c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b"
	body := []byte(`{"event_id":"evt_1","type":"payment.succeeded"}`)

	h := http.Header{}
	if err := s.Sign(h, "evt_1", time.Unix(1700000000, 0), body, []string{secret}); err != nil {
		panic(err)
	}
	fmt.Println("X-Kxp-Signature:", h.Get("X-Kxp-Signature"))
	fmt.Println("webhook-id:", h.Get("webhook-id"))

	s.Now = func() time.Time { return time.Unix(1700000000+301, 0) }
	_, err := s.Verify(h, body, []string{secret})
	fmt.Println(err)
	// Output:
	// X-Kxp-Signature: t=1700000000,v1=73aaaf1467acbe56d4ac54d3a6bc1861726585c7ec22741b9bb2f5353cab855e
	// webhook-id: evt_1
	// signer: timestamp too old: 5m1s behind the verifier's clock, tolerance 5m0s
}
