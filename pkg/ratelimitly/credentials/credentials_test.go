package credentials

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testSecret is 32 distinct bytes; its encodings are searched for in every
// output the package can produce.
var testSecret = func() (s [SecretSize]byte) {
	for i := range s {
		s[i] = byte(0xA0 + i)
	}
	return
}()

var testB64 = base64.StdEncoding.EncodeToString(testSecret[:])

// leaks reports whether out contains the secret in any common rendering.
func leaks(out string) bool {
	forms := []string{
		testB64,
		strings.TrimRight(testB64, "="),
		testB64[:16], // even a prefix of the encoded secret is a leak
		hex.EncodeToString(testSecret[:]),
		hex.EncodeToString(testSecret[:8]),
		string(testSecret[:8]),
		fmt.Sprint(testSecret[:4]), // [160 161 162 163
		strings.Trim(fmt.Sprint(testSecret[:4]), "[]"),
		fmt.Sprintf("%#x", testSecret[0]) + ", " + fmt.Sprintf("%#x", testSecret[1]),
	}
	for _, f := range forms {
		if strings.Contains(out, f) {
			return true
		}
	}
	return false
}

func TestParseSingle(t *testing.T) {
	src := "tenant: acme\nkey_id: 7\nsecret: " + testB64 + "\nmax_horizon: 80ms\n"
	creds, err := Parse("c.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(creds) != 1 {
		t.Fatalf("got %d credentials", len(creds))
	}
	c := creds[0]
	if c.Tenant != "acme" || c.KeyID != 7 || c.Secret != testSecret || c.MaxHorizon != 80*time.Millisecond {
		t.Fatalf("parsed %s with secret match %v", c, c.Secret == testSecret)
	}
}

func TestParseList(t *testing.T) {
	other := base64.RawStdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)) // unpadded accepted
	src := "credentials:\n  - tenant: a\n    key_id: 1\n    secret: " + testB64 + "\n  - tenant: b\n    key_id: 0xffffffff\n    secret: " + other + "\n"
	creds, err := Parse("c.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(creds) != 2 || creds[0].KeyID != 1 || creds[1].KeyID != 0xffffffff || creds[1].Secret[0] != 1 || creds[0].MaxHorizon != 0 {
		t.Fatalf("parsed %v", creds)
	}
}

func TestParseErrors(t *testing.T) {
	short := base64.StdEncoding.EncodeToString(testSecret[:31])
	long := base64.StdEncoding.EncodeToString(append(testSecret[:], 1))
	cases := []struct {
		name, src string
		want      []string // each must appear as an error line
	}{
		{"bad base64", "tenant: a\nkey_id: 1\nsecret: '" + testB64[:20] + "!!" + testB64[22:] + "'\n", []string{"c.yaml:3: secret: not valid base64"}},
		{"short secret", "tenant: a\nkey_id: 1\nsecret: " + short + "\n", []string{"c.yaml:3: secret: decodes to the wrong length"}},
		{"long secret", "tenant: a\nkey_id: 1\nsecret: " + long + "\n", []string{"c.yaml:3: secret: decodes to the wrong length"}},
		{"missing fields", "max_horizon: 1s\n", []string{"c.yaml:1: missing tenant", "c.yaml:1: missing key_id", "c.yaml:1: missing secret"}},
		{"unknown key", "tenant: a\nkey_id: 1\nsecret: " + testB64 + "\nsecrets: x\n", []string{`c.yaml:4: unknown key "secrets"`}},
		{"secret as key name", "tenant: a\nkey_id: 1\nsecret: " + testB64 + "\n" + testB64 + ": x\n", []string{"c.yaml:4: unknown key (name not shown)"}},
		{"secret in key_id", "tenant: a\nkey_id: " + testB64 + "\nsecret: " + testB64 + "\n", []string{"c.yaml:2: key_id: want an integer"}},
		{"key_id overflow", "tenant: a\nkey_id: 4294967296\nsecret: " + testB64 + "\n", []string{"c.yaml:2: key_id: want an integer"}},
		{"negative key_id", "tenant: a\nkey_id: -1\nsecret: " + testB64 + "\n", []string{"c.yaml:2: key_id: want an integer"}},
		{"empty tenant", "tenant: ''\nkey_id: 1\nsecret: " + testB64 + "\n", []string{"c.yaml:1: tenant: want a non-empty string"}},
		{"bad horizon", "tenant: a\nkey_id: 1\nsecret: " + testB64 + "\nmax_horizon: soon\n", []string{"c.yaml:4: max_horizon: want a non-negative duration"}},
		{"sub-millisecond horizon", "tenant: a\nkey_id: 1\nsecret: " + testB64 + "\nmax_horizon: 1500us\n", []string{"c.yaml:4: max_horizon: want whole milliseconds"}},
		{"duplicate key", "tenant: a\ntenant: b\nkey_id: 1\nsecret: " + testB64 + "\n", []string{`c.yaml:2: duplicate key "tenant"`}},
		{"duplicate key_id", "credentials:\n- {tenant: a, key_id: 5, secret: " + testB64 + "}\n- {tenant: b, key_id: 5, secret: " + testB64 + "}\n", []string{"c.yaml:3: duplicate key_id 5 (first at line 2)"}},
		{"both shapes", "tenant: a\ncredentials: []\n", []string{"c.yaml:1: use either one top-level credential or a credentials list"}},
		{"empty list", "credentials: []\n", []string{"c.yaml:1: credentials: empty list"}},
		{"list not a list", "credentials: {tenant: a}\n", []string{"c.yaml:1: credentials: want a list"}},
		{"empty file", "", []string{"c.yaml:1: empty file"}},
		{"not a mapping", "- a\n", []string{"c.yaml:1: want a mapping"}},
		{"syntax error", "tenant: a\n  key_id: [1\n", []string{"c.yaml:"}},
		{"two documents", "tenant: a\nkey_id: 1\nsecret: " + testB64 + "\n---\ntenant: b\n", []string{"c.yaml:4: more than one YAML document"}},
		{"all errors collected", "credentials:\n- {tenant: a, key_id: x, secret: " + testB64 + "}\n- {tenant: b, key_id: 2, secret: " + short + ", extra: 1}\n", []string{"c.yaml:2: key_id", "c.yaml:3: unknown key \"extra\"", "c.yaml:3: secret: decodes to the wrong length"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			creds, err := Parse("c.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("accepted: %v", creds)
			}
			if creds != nil {
				t.Errorf("returned credentials with an error")
			}
			var le *LoadError
			if !errors.As(err, &le) {
				t.Fatalf("error %T is not a *LoadError", err)
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
			if len(le.Errs) < len(tc.want) {
				t.Errorf("got %d errors, want at least %d: %q", len(le.Errs), len(tc.want), msg)
			}
			if leaks(msg) {
				t.Errorf("error leaks the secret: %q", msg)
			}
		})
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "creds.yaml")
	if err := os.WriteFile(p, []byte("tenant: a\nkey_id: 3\nsecret: "+testB64+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	creds, err := Load(p)
	if err != nil || len(creds) != 1 || creds[0].Secret != testSecret {
		t.Fatalf("Load: %v %v", creds, err)
	}
	_, err = Load(filepath.Join(dir, "missing.yaml"))
	if err == nil || !strings.Contains(err.Error(), "missing.yaml") || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file error %v", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("tenant: a\nkey_id: 3\nsecret: "+testB64[:40]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); err == nil || !strings.HasPrefix(err.Error(), bad+":3: ") || leaks(err.Error()) {
		t.Fatalf("bad file error %v", err)
	}
}

// No formatting path of Credential prints the secret.
func TestSecretNeverFormatted(t *testing.T) {
	c := Credential{Tenant: "acme", KeyID: 9, Secret: testSecret, MaxHorizon: time.Second}
	type wrapper struct {
		Name string
		Cred Credential
		Ptr  *Credential
	}
	w := wrapper{"w", c, &c}
	var outs []string
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
		outs = append(outs, fmt.Sprintf(verb, c), fmt.Sprintf(verb, &c), fmt.Sprintf(verb, w), fmt.Sprintf(verb, []Credential{c}))
	}
	outs = append(outs, c.String(), c.GoString(), fmt.Sprint(c), fmt.Sprintln(c))
	j, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	outs = append(outs, string(j))
	var text, js bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("x", "cred", c, "w", w)
	slog.New(slog.NewJSONHandler(&js, nil)).Info("x", "cred", c, "ptr", &c)
	outs = append(outs, text.String(), js.String())
	for _, o := range outs {
		if leaks(o) {
			t.Errorf("secret leaked: %q", o)
		}
	}
	// The redacted forms still identify the key.
	if s := fmt.Sprintf("%+v", c); !strings.Contains(s, `tenant="acme"`) || !strings.Contains(s, "key_id=9") || !strings.Contains(s, "REDACTED") {
		t.Errorf("redacted form %q", s)
	}
	if !strings.Contains(js.String(), `"key_id":9`) {
		t.Errorf("json log %q", js.String())
	}
	// The leak detector itself must detect a raw dump.
	if !leaks(fmt.Sprintf("%v", testSecret)) || !leaks(fmt.Sprintf("%x", testSecret)) {
		t.Fatal("leak detector does not detect a raw secret")
	}
}
