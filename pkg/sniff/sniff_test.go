package sniff

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
)

// clientHello returns the first flight of a real crypto/tls client.
func clientHello(t testing.TB, sni string, alpn ...string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	go func() {
		cl := tls.Client(c, &tls.Config{ServerName: sni, NextProtos: alpn, InsecureSkipVerify: sni == ""})
		cl.Handshake()
		c.Close()
	}()
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := s.Read(buf)
		out = append(out, buf[:n]...)
		var h Hello
		if e := ParseHello(out, nil, &h); e != ErrNeedMore || err != nil {
			return out
		}
	}
}

func TestDetect(t *testing.T) {
	hello := []byte{0x16, 3, 1, 0, 200, 1, 0, 0, 196}
	tests := []struct {
		in   string
		want Kind
	}{
		{"", NeedMore},
		{"\x16", NeedMore},
		{"\x16\x03\x01\x00", NeedMore},
		{string(hello[:6]), TLS},
		{string(hello), TLS},
		{"\x16\x03\x01\x00\xc8\x02", Other}, // ServerHello
		{"\x16\x02", Other},                 // not TLS 1.x
		{"\x16\x03\x09", Other},             // unknown minor
		{"\x16\x03\x01\x00\x00", Other},     // empty record
		{"\x16\x03\x01\xff\xff", Other},     // record over 2^14
		{"\x17\x03\x03\x00\x10", Other},     // application data
		{"P", NeedMore},
		{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r", NeedMore},
		{Preface, HTTP2},
		{Preface + "\x00\x00", HTTP2},
		{"PRI * HTTP/1.1\r\n", HTTP1}, // the parser answers it
		{"POST / HTTP/1.1\r\n", HTTP1},
		{"GET", NeedMore},
		{"GET ", NeedMore}, // one word so far
		{"GET /", HTTP1},
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", HTTP1},
		{"M-SEARCH * HTTP/1.1\r\n", HTTP1},
		{"get / HTTP/1.1\r\n", HTTP1},
		{"get /a", HTTP1},
		{"get a", NeedMore},
		{"get a\r\n", Other},
		{"get a *", HTTP1},
		{"get http://h/admin", HTTP1},
		{"get h http/1.1\r\n", HTTP1},
		{"get /a b HTTP/1.1\r\n", HTTP1},
		{"\r\nGET / HTTP/1.1\r\n", HTTP1},
		{"GETTINGLONGERANDLONGERTHANANYMETHOD", HTTP1},
		{"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n", Other},
		{"SSH-2.0-OpenSSH_9.2p1\r\n", Other},
		{"SSH-2.0-OpenSSH_9.2p1 Debian", NeedMore},
		{"SSH-2.0-x y HTTP/1.1\r\n", HTTP1},
		{"*1\r\n$4\r\nPING\r\n", Other}, // Redis
		{"PING\r\n", Other},
		{" GET /admin HTTP/1.1\r\n", HTTP1},
		{"\tGET /admin HTTP/1.1\r\n", HTTP1},
		{"GET\t/admin\tHTTP/1.1\r\n", HTTP1},
		{"GET\v/admin\fHTTP/1.1\r\n", HTTP1},
		{"GET\r/admin HTTP/1.1\r\n", HTTP1},
		{"GET\x1f/admin\xa0HTTP/1.1\r\n", HTTP1},
		{"\xa0\x85GET\x85/admin\r\n", HTTP1},
		{"GET\r", NeedMore},
		{"GET\r\n", Other},
		{"PING \r\n", Other},
		{" PING\r\n", Other},
		{" \r\n", HTTP1},
		{"   ", NeedMore},
		{strings.Repeat(" ", 8<<10), HTTP1},
		{"x " + strings.Repeat("a", 8<<10), HTTP1},
		{"SSH-2.0-x\ty\r\n", Other},
		{"SSH-2.0-x y\x01z\r\n", Other},
		{"SSH-2.0-x\t/admin\r\n", HTTP1},
		{" \x00", Other},
		{"G\x00ET / HTTP/1.1\r\n", Other},
		{"\x00\x01\x02", Other},
		{"\xff\xfe", Other},
	}
	for _, tt := range tests {
		if got := Detect([]byte(tt.in)); got != tt.want {
			t.Errorf("Detect(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// TestDetectPrefixes: every prefix of a classified input is NeedMore or
// the same kind (a caller may decide on any read boundary).
func TestDetectPrefixes(t *testing.T) {
	for _, in := range [][]byte{clientHello(t, "a.example"), []byte(Preface), []byte("GET / HTTP/1.1\r\n"),
		[]byte("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"), []byte("get / HTTP/1.1\r\n"), []byte(" GET /admin HTTP/1.1\r\n"),
		[]byte("GET\t/admin\tHTTP/1.1\r\n"), []byte("SSH-2.0-x y http/1.1\r\n"), []byte("PING\r\n")} {
		want := Detect(in)
		for n := range len(in) {
			if k := Detect(in[:n]); k != NeedMore && k != want {
				t.Errorf("Detect(%q[:%d]) = %v, whole %v", in, n, k, want)
			}
		}
	}
}

func TestParseHelloReal(t *testing.T) {
	in := clientHello(t, "WWW.Example.com", "h2", "http/1.1")
	var h Hello
	if err := ParseHello(in, nil, &h); err != nil {
		t.Fatal(err)
	}
	if string(h.SNI) != "WWW.Example.com" || string(h.FirstALPN()) != "h2" || h.Version != 0x0303 || h.Len != len(in) {
		t.Fatalf("got SNI %q ALPN %q version %x len %d/%d", h.SNI, h.FirstALPN(), h.Version, h.Len, len(in))
	}
	var protos []string
	h.Protocols(func(p []byte) bool { protos = append(protos, string(p)); return true })
	if len(protos) != 2 || protos[1] != "http/1.1" {
		t.Fatalf("protocols %q", protos)
	}
	// Bytes after the ClientHello (a client that pipelines) are not part of it.
	var h2 Hello
	if err := ParseHello(append(append([]byte{}, in...), 0x17, 3, 3), nil, &h2); err != nil || h2.Len != len(in) {
		t.Fatalf("with trailing bytes: %v len %d", err, h2.Len)
	}
	for n := range len(in) {
		if err := ParseHello(in[:n], nil, &h); err != ErrNeedMore {
			t.Fatalf("prefix %d: %v", n, err)
		}
	}
	// No SNI (an IP-address client), no ALPN.
	if err := ParseHello(clientHello(t, ""), nil, &h); err != nil || h.SNI != nil || h.ALPN != nil {
		t.Fatalf("bare hello: %v %q %q", err, h.SNI, h.ALPN)
	}
}

// fragment re-splits the handshake message of a one-record hello into
// records of at most size bytes.
func fragment(in []byte, size int) []byte {
	msg := in[5:]
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, 0x16, 3, 1, byte(n>>8), byte(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

func TestParseHelloFragmented(t *testing.T) {
	in := clientHello(t, "frag.example", "h2")
	scratch := make([]byte, MaxHello+4)
	for _, size := range []int{1, 2, 3, 4, 5, 100, len(in) - 6} {
		f := fragment(in, size)
		var h Hello
		if err := ParseHello(f, scratch, &h); err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if string(h.SNI) != "frag.example" || string(h.FirstALPN()) != "h2" || h.Len != len(f) {
			t.Fatalf("size %d: SNI %q ALPN %q len %d/%d", size, h.SNI, h.FirstALPN(), h.Len, len(f))
		}
		if err := ParseHello(f[:len(f)-1], scratch, &h); err != ErrNeedMore {
			t.Fatalf("size %d minus one: %v", size, err)
		}
		// Without scratch room a split hello is refused, never read past.
		if err := ParseHello(f, scratch[:8], &h); err != ErrTooLarge {
			t.Fatalf("size %d small scratch: %v", size, err)
		}
	}
}

// hello builds a ClientHello record from extension bytes.
func hello(ext []byte) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...)
	body = append(body, 0, 0, 2, 0x13, 0x01, 1, 0)
	if ext != nil {
		body = append(body, byte(len(ext)>>8), byte(len(ext)))
		body = append(body, ext...)
	}
	hs := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{0x16, 3, 1, byte(len(hs) >> 8), byte(len(hs))}, hs...)
}

func ext(typ int, data []byte) []byte {
	return append([]byte{byte(typ >> 8), byte(typ), byte(len(data) >> 8), byte(len(data))}, data...)
}

func sni(names ...string) []byte {
	var list []byte
	for _, n := range names {
		list = append(list, 0, byte(len(n)>>8), byte(len(n)))
		list = append(list, n...)
	}
	return ext(0, append([]byte{byte(len(list) >> 8), byte(len(list))}, list...))
}

func TestParseHelloStrict(t *testing.T) {
	alpn := ext(16, []byte{0, 3, 2, 'h', '2'})
	tests := []struct {
		name string
		in   []byte
		want error
		sni  string
	}{
		{"minimal", hello(nil), nil, ""},
		{"sni", hello(sni("a.b")), nil, "a.b"},
		{"sni and alpn", hello(append(sni("x"), alpn...)), nil, "x"},
		{"two host names", hello(sni("a", "b")), ErrBadSNI, ""},
		{"empty host name", hello(sni("")), ErrBadSNI, ""},
		{"trailing dot", hello(sni("a.b.")), ErrBadSNI, ""},
		{"empty label", hello(sni("a..b")), ErrBadSNI, ""},
		{"bad byte", hello(sni("a b")), ErrBadSNI, ""},
		{"nul", hello(sni("a\x00b")), ErrBadSNI, ""},
		{"long name", hello(sni(string(bytes.Repeat([]byte("a"), 256)))), ErrBadSNI, ""},
		{"duplicate sni", hello(append(sni("a"), sni("a")...)), ErrDuplicate, ""},
		{"duplicate alpn", hello(append(alpn, alpn...)), ErrDuplicate, ""},
		{"empty sni list", hello(ext(0, []byte{0, 0})), ErrBadSNI, ""},
		{"sni list too long", hello(ext(0, []byte{0, 9, 0, 0, 1, 'a'})), ErrBadSNI, ""},
		{"empty alpn name", hello(ext(16, []byte{0, 2, 0, 'x'})), ErrBadALPN, ""},
		{"alpn overrun", hello(ext(16, []byte{0, 2, 5, 'x'})), ErrBadALPN, ""},
		{"extension overrun", hello([]byte{0, 0, 0, 9, 1}), ErrMalformed, ""},
		{"server hello", func() []byte { b := hello(nil); b[5] = 2; return b }(), ErrNotHello, ""},
		{"not handshake", func() []byte { b := hello(nil); b[0] = 0x17; return b }(), ErrNotHello, ""},
		{"huge message", []byte{0x16, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff}, ErrTooLarge, ""},
		{"short message", []byte{0x16, 3, 1, 0, 4, 1, 0, 0, 1}, ErrMalformed, ""},
		{"record shorter than message", func() []byte {
			b := hello(nil)
			b = append(b[:len(b):len(b)], 0x15, 3, 1, 0, 2, 2, 40) // an alert follows
			b[4]--
			return b[:len(b)-1]
		}(), ErrNotHello, ""},
		{"message shorter than record", func() []byte { b := hello(nil); b[4]++; return append(b, 0) }(), ErrMalformed, ""},
	}
	scratch := make([]byte, MaxHello+4)
	for _, tt := range tests {
		var h Hello
		err := ParseHello(tt.in, scratch, &h)
		if !errors.Is(err, tt.want) || err == nil && string(h.SNI) != tt.sni {
			t.Errorf("%s: err %v SNI %q, want %v %q", tt.name, err, h.SNI, tt.want, tt.sni)
		}
	}
}
