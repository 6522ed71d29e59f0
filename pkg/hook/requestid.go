package hook

import (
	"math/rand/v2"

	"github.com/rl-tproxy/rl-tproxy/pkg/httpparse"
)

// MaxRequestIDLen is the longest client request id passed through; a
// longer one is replaced (or dropped when generation is off).
const MaxRequestIDLen = 128

// validRequestID: 1 to MaxRequestIDLen visible ASCII bytes, without '"'
// and '\' so that every log layout can carry it unescaped.
func validRequestID(v []byte) bool {
	if len(v) == 0 || len(v) > MaxRequestIDLen {
		return false
	}
	for _, c := range v {
		if c <= ' ' || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// clientRequestID returns the request's id field when it appears exactly
// once with a valid value and is not named in Connection (the proxy drops
// such a field, so the upstream would never see it).
func clientRequestID(h *httpparse.Request, name []byte) ([]byte, bool) {
	if h == nil || httpparse.ConnectionHas(h.Headers, name) {
		return nil, false
	}
	var v []byte
	n := 0
	for i := range h.Headers {
		if httpparse.EqualFoldBytes(h.Headers[i].Name, name) {
			v = h.Headers[i].Value
			n++
		}
	}
	return v, n == 1 && validRequestID(v)
}

const hexDigits = "0123456789abcdef"

// appendGeneratedID appends a fresh id: 128 random bits in 32 lowercase
// hex digits, the shape of nginx's $request_id. math/rand/v2's global source is
// the runtime's per-thread ChaCha8, seeded from the OS: no lock, no
// allocation.
func appendGeneratedID(b []byte) []byte {
	for range 2 {
		x := rand.Uint64()
		for i := 60; i >= 0; i -= 4 {
			b = append(b, hexDigits[(x>>uint(i))&0xf])
		}
	}
	return b
}

// requestID sets st.rid for this request: the client's valid id, else a
// generated one (when the policy asks) that st.fwd carries upstream.
func (st *state) requestID(h *httpparse.Request) {
	st.rid, st.fwd = st.rid[:0], st.fwd[:0]
	if st.gen == nil || len(st.gen.ridName) == 0 {
		return
	}
	if v, ok := clientRequestID(h, st.gen.ridName); ok {
		st.rid = append(st.rid, v...)
		return
	}
	if !st.gen.ridGenerate {
		return
	}
	st.rid = appendGeneratedID(st.rid)
	st.fwd = append(st.fwd, httpparse.Header{Name: st.gen.ridName, Value: st.rid})
}
