package credentials

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

var errLine = regexp.MustCompile(`^f\.yaml:[0-9]+: \S`)

// FuzzParse: Parse never panics, succeeds only with complete credentials,
// and every error is a located FILE:LINE: message.
func FuzzParse(f *testing.F) {
	f.Add([]byte("tenant: a\nkey_id: 1\nsecret: " + testB64 + "\n"))
	f.Add([]byte("credentials:\n- {tenant: a, key_id: 1, secret: " + testB64 + ", max_horizon: 1s}\n"))
	f.Add([]byte("tenant: [\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		creds, err := Parse("f.yaml", data)
		if err != nil {
			var le *LoadError
			if !errors.As(err, &le) || len(le.Errs) == 0 {
				t.Fatalf("error %T %v is not a non-empty *LoadError", err, err)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !errLine.MatchString(line) {
					t.Fatalf("unlocated error line %q", line)
				}
			}
			return
		}
		if len(creds) == 0 {
			t.Fatal("no error and no credentials")
		}
		seen := map[uint32]bool{}
		for _, c := range creds {
			if c.Tenant == "" || c.MaxHorizon < 0 || seen[c.KeyID] {
				t.Fatalf("invalid credential accepted: %v", c)
			}
			seen[c.KeyID] = true
		}
	})
}
