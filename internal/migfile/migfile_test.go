package migfile_test

import (
	"errors"
	"testing"
	"testing/fstest"

	"github.com/txhook/txhook/internal/migfile"
)

func TestSplit(t *testing.T) {
	up, down, err := migfile.Split("-- header\n\n-- +goose Up\nCREATE TABLE a (x int);\n-- +goose StatementBegin\nSELECT 1;\n-- +goose StatementEnd\n\n-- +goose Down\nDROP TABLE a;\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "CREATE TABLE a (x int);\n-- +goose StatementBegin\nSELECT 1;\n-- +goose StatementEnd\n"; up != want {
		t.Errorf("up = %q, want %q", up, want)
	}
	if down != "DROP TABLE a;\n" {
		t.Errorf("down = %q", down)
	}
	for name, text := range map[string]string{
		"no annotations":     "CREATE TABLE a (x int);\n",
		"SQL before Up":      "CREATE TABLE a (x int);\n-- +goose Up\nSELECT 1;\n-- +goose Down\n",
		"no Down":            "-- +goose Up\nSELECT 1;\n",
		"Down before Up":     "-- +goose Down\nSELECT 1;\n-- +goose Up\nSELECT 1;\n",
		"two Ups":            "-- +goose Up\nSELECT 1;\n-- +goose Up\n-- +goose Down\n",
		"empty Up":           "-- +goose Up\n-- +goose Down\nSELECT 1;\n",
		"no transaction":     "-- +goose NO TRANSACTION\n-- +goose Up\nSELECT 1;\n-- +goose Down\n",
		"unknown annotation": "-- +goose Up\n-- +goose ENVSUB ON\nSELECT 1;\n-- +goose Down\n",
	} {
		if _, _, err := migfile.Split(text); !errors.Is(err, migfile.ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
}

func TestList(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	ok := "-- +goose Up\nSELECT 1;\n-- +goose Down\nSELECT 2;\n"
	ms, err := migfile.List(fstest.MapFS{"010_b.sql": file(ok), "002_a.sql": file(ok), "README.md": file("x")})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Version != 2 || ms[0].Name != "002_a" || ms[1].Version != 10 {
		t.Fatalf("List = %+v", ms)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"no number":    {"init.sql": file(ok)},
		"zero":         {"000_init.sql": file(ok)},
		"same version": {"001_a.sql": file(ok), "1_b.sql": file(ok)},
		"malformed":    {"001_a.sql": file("SELECT 1;")},
	} {
		if _, err := migfile.List(fsys); !errors.Is(err, migfile.ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
}
