package hook

import (
	"bytes"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// Whatever request id fields a client sends, the request keeps exactly
// one valid value: its own when it sent one valid field, else a generated
// one that is forwarded in place of its fields.
func FuzzRequestID(f *testing.F) {
	f.Add([]byte("X-Request-ID: abc-123\r\n"))
	f.Add([]byte("x-request-id: a\r\nX-Request-Id: b\r\n"))
	f.Add([]byte("X-Request-ID: two words\r\n"))
	f.Add([]byte("X-Request-ID: \"q\"\r\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, fields []byte) {
		var h httpparse.Request
		raw := append(append([]byte("GET / HTTP/1.1\r\nHost: h\r\n"), fields...), "\r\n"...)
		if h.Parse(raw, httpparse.Limits{}) != nil {
			return
		}
		name := []byte("X-Request-ID")
		st := &state{gen: &generation{ridName: name, ridGenerate: true}, rid: make([]byte, 0, MaxRequestIDLen)}
		st.requestID(&h)
		if !validRequestID(st.rid) {
			t.Fatalf("request id %q is not valid", st.rid)
		}
		v, ok := clientRequestID(&h, name)
		switch {
		case ok && (!bytes.Equal(st.rid, v) || len(st.fwd) != 0):
			t.Fatalf("client id %q not kept: %q, forward %v", v, st.rid, st.fwd)
		case !ok && (len(st.rid) != 32 || len(st.fwd) != 1 || !bytes.Equal(st.fwd[0].Value, st.rid)):
			t.Fatalf("no valid client id: got %q, forward %v", st.rid, st.fwd)
		}
	})
}

// BenchmarkRequestID: choosing the id of a request that has none (a
// generated one) and of one that sent a valid id.
func BenchmarkRequestID(b *testing.B) {
	for _, c := range []struct{ name, fields string }{{"generated", ""}, {"client", "X-Request-ID: 0af7651916cd43dd8448eb211c80319c\r\n"}} {
		b.Run(c.name, func(b *testing.B) {
			var h httpparse.Request
			if err := h.Parse([]byte("GET / HTTP/1.1\r\nHost: h\r\nUser-Agent: x\r\nAccept: */*\r\n"+c.fields+"\r\n"), httpparse.Limits{}); err != nil {
				b.Fatal(err)
			}
			st := &state{gen: &generation{ridName: []byte("X-Request-ID"), ridGenerate: true},
				rid: make([]byte, 0, MaxRequestIDLen), fwd: make([]httpparse.Header, 0, 1)}
			b.ReportAllocs()
			for b.Loop() {
				st.requestID(&h)
			}
		})
	}
}
