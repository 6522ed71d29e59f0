package simulate

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rl-tproxy/rl-tproxy/internal/fuzzcorpus"
)

// seedLines are access lines as the product writes them, and hostile
// variants of them.
func seedLines(t testing.TB, format string) [][]byte {
	logged := writeLog(t, format, []line{
		{remote: "10.0.0.1:4000", path: "/api/a", query: "page=2&u=\"x\"", loc: "api", outcome: "deny", cause: "deny_resource", status: 429, durMs: 1.5},
		{at: time.Second, remote: "[2001:db8::1]:443", path: "/caf\xc3\xa9/\x01", loc: "-", outcome: "bypass", cause: "unmatched", status: 200},
	})
	seeds := bytes.Split(bytes.TrimSpace(logged), []byte("\n"))
	if format == FormatJSON {
		return append(seeds,
			[]byte(`{"msg":"access","time":"2026-12-01T03:40:11Z","path":"\ud83d\ude00\ud800x\u00e9","status":1e3,"duration_ms":-1}`),
			[]byte(`{"msg":"access","time":"2026-12-01T03:40:11Z","g":{"a":[[[[{}]]]]},"host":"h"}`),
			[]byte(`{"msg":"access","time":"2026-12-01T03:40:11Z","path":"/a","path":"/b"}`),
			[]byte(`{"msg":"access"`),
			[]byte(strings.Repeat("[", 100)),
		)
	}
	return append(seeds,
		[]byte(`1.2.3.4 - - [01/Dec/2026:03:40:11 +0000] "GET /\xZZ HTTP/1.1" 200 1 "-" "-"`),
		[]byte(`1.2.3.4 - - [01/Dec/2026:03:40:11 +0000] "-" 499 - "-" "-" service="a b" k=`),
		[]byte(`time=2026-12-01T03:40:11Z level=INFO msg=listening`),
		[]byte(`- - - [] "" 0 0 "" ""`),
	)
}

// FuzzParseJSON: any line parses or fails without panicking, and where
// encoding/json reads the same line as an object, the string fields
// simulate uses agree with it.
func FuzzParseJSON(f *testing.F) {
	for _, s := range seedLines(f, FormatJSON) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var r Record
		if ParseJSON(line, &r) != nil {
			return
		}
		var m map[string]any
		if json.Unmarshal(line, &m) != nil {
			return // simulate accepts some numbers encoding/json does not
		}
		for key, got := range map[string][]byte{"path": r.Path, "host": r.Host, "service": r.Service, "location": r.Location, "query": r.Query, "outcome": r.Outcome} {
			want, ok := m[key].(string)
			if !ok {
				continue
			}
			if jsonUTF8(got) != want {
				t.Fatalf("%s: %q, encoding/json %q", key, got, want)
			}
		}
	})
}

// jsonUTF8 is b as encoding/json decodes a string's raw bytes: each byte
// that does not start a valid UTF-8 sequence becomes U+FFFD on its own
// (bytes.ToValidUTF8 would fold a run of them into one).
func jsonUTF8(b []byte) string {
	var sb strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			sb.WriteRune(utf8.RuneError)
		} else {
			sb.Write(b[:n])
		}
		b = b[n:]
	}
	return sb.String()
}

// FuzzParseCombined: any line parses or fails without panicking, and a
// parsed line has a three-digit-or-less status and a time.
func FuzzParseCombined(f *testing.F) {
	for _, s := range seedLines(f, FormatCombined) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var r Record
		if ParseCombined(line, &r) != nil {
			return
		}
		if r.Status < 0 || r.Status > 999 || r.Time.IsZero() {
			t.Fatalf("status %d time %v", r.Status, r.Time)
		}
	})
}

// TestParseCorpus checks that testdata/fuzz holds the generated seeds
// (RL_WRITE_CORPUS=1 rewrites them).
func TestParseCorpus(t *testing.T) {
	fuzzcorpus.Sync(t, "FuzzParseJSON", seedLines(t, FormatJSON))
	fuzzcorpus.Sync(t, "FuzzParseCombined", seedLines(t, FormatCombined))
}

// The parsers read back what the product writes, field by field.
func TestParseRoundTrip(t *testing.T) {
	for _, format := range []string{FormatJSON, FormatCombined} {
		seeds := seedLines(t, format)
		parse := ParseJSON
		if format == FormatCombined {
			parse = ParseCombined
		}
		var r Record
		if err := parse(seeds[0], &r); err != ErrNotAccess {
			t.Fatalf("%s: the listening line: %v", format, err)
		}
		if err := parse(seeds[1], &r); err != nil {
			t.Fatalf("%s: %v: %s", format, err, seeds[1])
		}
		if string(r.Path) != "/api/a" || string(r.Query) != `page=2&u="x"` || r.Status != 429 || string(r.Outcome) != "deny" ||
			string(r.Service) != "web" || string(r.Location) != "api" || string(r.Host) != "shop.example" ||
			string(r.UserAgent) != `curl/8 "quoted"` || !r.HasDuration || r.DurationMs != 1.5 || !r.Time.Equal(t0) {
			t.Errorf("%s: %+v", format, r)
		}
		if err := parse(seeds[2], &r); err != nil || string(r.Path) != "/caf\xc3\xa9/\x01" {
			t.Errorf("%s: %v path %q", format, err, r.Path)
		}
		if format == FormatJSON && string(r.Remote) != "[2001:db8::1]:443" || format == FormatCombined && string(r.Remote) != "2001:db8::1" {
			t.Errorf("%s: remote %q", format, r.Remote)
		}
	}
}
