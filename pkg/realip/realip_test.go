package realip

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
)

func TestMain(m *testing.M) { testkit.VerifyMain(m) }

func mustTrusted(t testing.TB, cidrs ...string) *Trusted {
	t.Helper()
	tr, err := ParseTrusted(cidrs)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func vals(s ...string) [][]byte {
	var out [][]byte
	for _, v := range s {
		out = append(out, []byte(v))
	}
	return out
}

func TestParseTrusted(t *testing.T) {
	tr := mustTrusted(t, "10.0.0.0/8", "192.0.2.7", "2001:db8::/32", "::ffff:198.51.100.0/120")
	for addr, want := range map[string]bool{
		"10.1.2.3": true, "11.0.0.1": false, "192.0.2.7": true, "192.0.2.8": false,
		"2001:db8::5": true, "2001:db9::5": false, "::ffff:10.0.0.1": true, // mapped peer: its IPv4
		"198.51.100.9": true, // mapped prefix: its IPv4
	} {
		if got := tr.Contains(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Contains(%s) = %v, want %v", addr, got, want)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "10.0.0.1/8", "fe80::1%eth0", "example.com", "", "10.0.0.0/8 "} {
		if _, err := ParseTrusted([]string{bad}); err == nil {
			t.Errorf("ParseTrusted(%q) accepted it", bad)
		}
	}
	var none *Trusted
	if none.Contains(netip.MustParseAddr("10.0.0.1")) || none.Len() != 0 {
		t.Error("a nil set trusts")
	}
}

func TestFromXFF(t *testing.T) {
	tr := mustTrusted(t, "127.0.0.1/32", "10.0.0.0/8")
	lb := netip.MustParseAddr("127.0.0.1")
	for _, tc := range []struct {
		name   string
		peer   netip.Addr
		values [][]byte
		want   string // "" = not believed: keep the peer
	}{
		{"one", lb, vals("203.0.113.7"), "203.0.113.7"},
		{"rightmost untrusted", lb, vals("198.51.100.9, 203.0.113.7"), "203.0.113.7"},
		{"trusted hops skipped", lb, vals("203.0.113.7, 10.1.1.1, 10.2.2.2"), "203.0.113.7"},
		{"spoofed left part ignored", lb, vals("1.1.1.1, 203.0.113.8"), "203.0.113.8"},
		{"several lines", lb, vals("198.51.100.9", "203.0.113.7, 10.0.0.1"), "203.0.113.7"},
		{"all trusted: leftmost", lb, vals("10.0.0.2, 10.0.0.3"), "10.0.0.2"},
		{"ipv6", lb, vals("2001:db8::1"), "2001:db8::1"},
		{"mapped", lb, vals("::ffff:203.0.113.7"), "203.0.113.7"},
		{"tabs and spaces", lb, vals(" 203.0.113.7\t,\t10.0.0.1 "), "203.0.113.7"},
		{"untrusted peer", netip.MustParseAddr("192.0.2.1"), vals("203.0.113.7"), ""},
		{"no header", lb, nil, ""},
		{"empty value", lb, vals(""), ""},
		{"empty element", lb, vals("203.0.113.7,,10.0.0.1"), ""},
		{"unknown", lb, vals("unknown, 203.0.113.7"), ""},
		{"port", lb, vals("203.0.113.7:4711"), ""},
		{"zone", lb, vals("fe80::1%eth0"), ""},
		{"garbage left of the client", lb, vals("x!, 203.0.113.7"), ""},
		{"too many hops", lb, vals(strings.TrimSuffix(strings.Repeat("10.0.0.1,", 33), ",")), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tr.FromXFF(tc.peer, tc.values)
			if tc.want == "" {
				if ok {
					t.Fatalf("believed %v", got)
				}
				return
			}
			if !ok || got != netip.MustParseAddr(tc.want).Unmap() {
				t.Fatalf("got %v, %v; want %s", got, ok, tc.want)
			}
		})
	}
}

func TestFromForwarded(t *testing.T) {
	tr := mustTrusted(t, "127.0.0.1/32", "10.0.0.0/8")
	lb := netip.MustParseAddr("127.0.0.1")
	for _, tc := range []struct {
		name   string
		values [][]byte
		want   string
	}{
		{"one", vals("for=203.0.113.7"), "203.0.113.7"},
		{"rfc example", vals(`for="_gazonk"`), ""},
		{"quoted v6 with port", vals(`For="[2001:db8:cafe::17]:4711"`), "2001:db8:cafe::17"},
		{"v4 with port quoted", vals(`for="192.0.2.60:8080";proto=http;by=203.0.113.43`), "192.0.2.60"},
		{"v4 with port unquoted", vals(`for=192.0.2.60:8080`), "192.0.2.60"},
		{"chain", vals(`for=198.51.100.9, for=203.0.113.7;proto=https, for=10.0.0.1`), "203.0.113.7"},
		{"several lines", vals(`for=198.51.100.9`, `for=203.0.113.7`), "203.0.113.7"},
		{"all trusted", vals(`for=10.0.0.5, for=10.0.0.6`), "10.0.0.5"},
		{"element without for", vals(`proto=https, for=203.0.113.7`), ""},
		{"unknown", vals(`for=unknown`), ""},
		{"two for", vals(`for=1.2.3.4;for=5.6.7.8`), ""},
		{"unterminated quote", vals(`for="1.2.3.4`), ""},
		{"escape in quote", vals(`for="1.2.3.\4"`), ""},
		{"v6 unquoted brackets", vals(`for=[2001:db8::1]`), "2001:db8::1"},
		{"v6 without brackets", vals(`for="2001:db8::1"`), ""},
		{"bad name", vals(`f r=1.2.3.4`), ""},
		{"trailing garbage", vals(`for=1.2.3.4 x`), ""},
		{"empty", vals(""), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tr.FromForwarded(lb, tc.values)
			if tc.want == "" {
				if ok {
					t.Fatalf("believed %v", got)
				}
				return
			}
			if !ok || got != netip.MustParseAddr(tc.want) {
				t.Fatalf("got %v, %v; want %s", got, ok, tc.want)
			}
		})
	}
	if _, ok := tr.FromForwarded(netip.MustParseAddr("192.0.2.1"), vals("for=203.0.113.7")); ok {
		t.Error("believed an untrusted peer")
	}
}

func FuzzFromHeaders(f *testing.F) {
	f.Add("198.51.100.9, 203.0.113.7", `for=203.0.113.7;proto=https, for=10.0.0.1`)
	f.Add(" 2001:db8::1\t", `For="[2001:db8:cafe::17]:4711"`)
	f.Add("unknown", `for="_gazonk"`)
	tr, err := ParseTrusted([]string{"127.0.0.0/8", "10.0.0.0/8"})
	if err != nil {
		f.Fatal(err)
	}
	peer := netip.MustParseAddr("127.0.0.1")
	f.Fuzz(func(t *testing.T, xff, fwd string) {
		for _, v := range [][][]byte{{[]byte(xff)}, {[]byte(xff), []byte(fwd)}} {
			for _, fn := range []func(netip.Addr, [][]byte) (netip.Addr, bool){tr.FromXFF, tr.FromForwarded} {
				if a, ok := fn(peer, v); ok && (!a.IsValid() || a.Zone() != "" || a.Is4In6()) {
					t.Fatalf("believed an invalid address %v from %q", a, v)
				}
			}
		}
		// An untrusted peer is never believed, whatever it sends.
		if a, ok := tr.FromXFF(netip.MustParseAddr("192.0.2.1"), [][]byte{[]byte(xff)}); ok {
			t.Fatalf("believed %v from an untrusted peer", a)
		}
	})
}
