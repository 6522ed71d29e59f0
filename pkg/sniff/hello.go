package sniff

import "errors"

// MaxHello is the largest ClientHello handshake message ParseHello
// accepts (body length, after the 4-byte handshake header). Real
// ClientHellos, post-quantum key shares included, are a few KiB.
const MaxHello = 16 << 10

// Errors of ParseHello. Every error but ErrNeedMore is final: the
// connection is not a TLS client this proxy relays.
var (
	ErrNeedMore  = errors.New("sniff: incomplete ClientHello")
	ErrNotHello  = errors.New("sniff: not a TLS ClientHello")
	ErrTooLarge  = errors.New("sniff: ClientHello too large")
	ErrMalformed = errors.New("sniff: malformed ClientHello")
	ErrBadSNI    = errors.New("sniff: malformed server_name extension")
	ErrBadALPN   = errors.New("sniff: malformed ALPN extension")
	ErrDuplicate = errors.New("sniff: duplicate extension")
)

// Extension numbers (RFC 6066, RFC 7301).
const (
	extServerName = 0
	extALPN       = 16
)

// Hello is what the proxy reads from a ClientHello. SNI and ALPN alias the
// buffer given to ParseHello (or its scratch) and are valid as long as it
// is.
type Hello struct {
	// SNI is the host_name of the server_name extension (empty when the
	// client sent none). Its bytes are checked to be a DNS host name
	// (letters, digits, '-', '_', '.'); case is as the client sent it.
	SNI []byte
	// ALPN is the protocol_name_list of the ALPN extension, without its
	// length prefix (empty when the client sent none); see Protocols.
	ALPN []byte
	// Len is how many bytes of the input the ClientHello's records take.
	Len int
	// Version is the legacy_version field (0x0303 for TLS 1.2 and 1.3).
	Version uint16
}

// FirstALPN returns the client's most preferred protocol ("" bytes when
// none was offered).
func (h *Hello) FirstALPN() []byte {
	if len(h.ALPN) == 0 {
		return nil
	}
	n := int(h.ALPN[0])
	return h.ALPN[1 : 1+n]
}

// Protocols calls fn with each offered ALPN protocol in the client's
// order, until fn returns false.
func (h *Hello) Protocols(fn func(p []byte) bool) {
	for b := h.ALPN; len(b) > 0; {
		n := int(b[0])
		if !fn(b[1 : 1+n]) {
			return
		}
		b = b[1+n:]
	}
}

// ParseHello parses the ClientHello at the start of b: one or more TLS
// handshake records (a ClientHello may be split across records). When it
// spans more than one record, its fragments are joined in scratch, which
// must then hold MaxHello+4 bytes (a shorter scratch gives ErrTooLarge).
// It returns ErrNeedMore while b is a valid prefix. It does not allocate.
func ParseHello(b, scratch []byte, h *Hello) error {
	*h = Hello{}
	msg, used, err := gather(b, scratch)
	if err != nil {
		return err
	}
	if err := parseBody(msg[4:], h); err != nil {
		return err
	}
	h.Len = used
	return nil
}

// gather returns the whole handshake message (header included) and the
// number of record bytes it took.
func gather(b, scratch []byte) (msg []byte, used int, err error) {
	var total int // handshake message length with its header; 0 = unknown
	joined := 0   // bytes copied to scratch
	first := true
	for {
		if len(b)-used < recordHeaderLen {
			return nil, 0, needOr(b[used:])
		}
		r := b[used:]
		if r[0] != recordHandshake || r[1] != 3 || r[2] > 4 {
			return nil, 0, ErrNotHello
		}
		n := int(r[3])<<8 | int(r[4])
		if n == 0 || n > MaxRecord {
			return nil, 0, ErrMalformed
		}
		if first && len(r) > recordHeaderLen && r[recordHeaderLen] != handshakeClientHi {
			return nil, 0, ErrNotHello
		}
		if len(r) < recordHeaderLen+n {
			if first && n >= 4 && len(r) >= recordHeaderLen+4 {
				if err := checkHeader(r[recordHeaderLen:]); err != nil {
					return nil, 0, err
				}
			}
			return nil, 0, ErrNeedMore
		}
		frag := r[recordHeaderLen : recordHeaderLen+n]
		used += recordHeaderLen + n
		if first {
			first = false
			if len(frag) < 4 {
				// The handshake header itself is split: join from here.
				if len(scratch) < 4 {
					return nil, 0, ErrTooLarge
				}
				joined = copy(scratch, frag)
				continue
			}
			if err := checkHeader(frag); err != nil {
				return nil, 0, err
			}
			total = 4 + (int(frag[1])<<16 | int(frag[2])<<8 | int(frag[3]))
			if len(frag) == total {
				return frag, used, nil
			}
			if len(frag) > total {
				return nil, 0, ErrMalformed // another message follows in the record
			}
			if len(scratch) < total {
				return nil, 0, ErrTooLarge
			}
			joined = copy(scratch, frag)
			continue
		}
		if total == 0 {
			if joined+len(frag) < 4 {
				joined += copy(scratch[joined:], frag)
				continue
			}
			k := copy(scratch[joined:4], frag)
			joined += k
			frag = frag[k:]
			if err := checkHeader(scratch[:4]); err != nil {
				return nil, 0, err
			}
			total = 4 + (int(scratch[1])<<16 | int(scratch[2])<<8 | int(scratch[3]))
			if len(scratch) < total {
				return nil, 0, ErrTooLarge
			}
		}
		if joined+len(frag) > total {
			return nil, 0, ErrMalformed
		}
		joined += copy(scratch[joined:total], frag)
		if joined == total {
			return scratch[:total], used, nil
		}
	}
}

// needOr judges a partial record header: ErrNeedMore unless its bytes
// so far cannot start a handshake record.
func needOr(rest []byte) error {
	if len(rest) > 0 && (rest[0] != recordHandshake || len(rest) > 1 && rest[1] != 3 || len(rest) > 2 && rest[2] > 4) {
		return ErrNotHello
	}
	return ErrNeedMore
}

// checkHeader checks a handshake header: a ClientHello of a sane length.
func checkHeader(hs []byte) error {
	if hs[0] != handshakeClientHi {
		return ErrNotHello
	}
	n := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
	if n > MaxHello {
		return ErrTooLarge
	}
	if n < 2+32+1+2+1 {
		return ErrMalformed
	}
	return nil
}

// reader is a bounds-checked cursor over a ClientHello body.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) u8() int {
	if len(r.b) < 1 {
		r.bad = true
		return 0
	}
	v := int(r.b[0])
	r.b = r.b[1:]
	return v
}

func (r *reader) u16() int {
	if len(r.b) < 2 {
		r.bad = true
		return 0
	}
	v := int(r.b[0])<<8 | int(r.b[1])
	r.b = r.b[2:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if len(r.b) < n || r.bad {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// parseBody parses the ClientHello body (RFC 8446 4.1.2).
func parseBody(body []byte, h *Hello) error {
	r := reader{b: body}
	h.Version = uint16(r.u16())
	r.bytes(32) // random
	sid := r.u8()
	if sid > 32 {
		return ErrMalformed
	}
	r.bytes(sid)
	cs := r.u16()
	if cs < 2 || cs%2 != 0 {
		return ErrMalformed
	}
	r.bytes(cs)
	cm := r.u8()
	if cm < 1 {
		return ErrMalformed
	}
	r.bytes(cm)
	if r.bad || h.Version < 0x0300 || h.Version > 0x03ff {
		return ErrMalformed
	}
	if len(r.b) == 0 {
		return nil // no extensions (legal before TLS 1.3)
	}
	ext := r.bytes(r.u16())
	if r.bad || len(r.b) != 0 {
		return ErrMalformed
	}
	return parseExtensions(ext, h)
}

func parseExtensions(ext []byte, h *Hello) error {
	r := reader{b: ext}
	sawSNI, sawALPN := false, false
	for len(r.b) > 0 {
		typ := r.u16()
		data := r.bytes(r.u16())
		if r.bad {
			return ErrMalformed
		}
		switch typ {
		case extServerName:
			if sawSNI {
				return ErrDuplicate
			}
			sawSNI = true
			sni, err := parseSNI(data)
			if err != nil {
				return err
			}
			h.SNI = sni
		case extALPN:
			if sawALPN {
				return ErrDuplicate
			}
			sawALPN = true
			list, err := parseALPN(data)
			if err != nil {
				return err
			}
			h.ALPN = list
		}
	}
	return nil
}

// parseSNI reads a server_name extension: exactly one host_name entry.
func parseSNI(data []byte) ([]byte, error) {
	r := reader{b: data}
	list := r.bytes(r.u16())
	if r.bad || len(r.b) != 0 || len(list) == 0 {
		return nil, ErrBadSNI
	}
	r = reader{b: list}
	var name []byte
	for len(r.b) > 0 {
		typ := r.u8()
		v := r.bytes(r.u16())
		if r.bad {
			return nil, ErrBadSNI
		}
		if typ != 0 {
			continue // unknown name types are skipped (RFC 6066 3)
		}
		if name != nil {
			return nil, ErrBadSNI // two host_names
		}
		if !validHost(v) {
			return nil, ErrBadSNI
		}
		name = v
	}
	return name, nil
}

// validHost accepts 1..255 bytes of letters, digits, '-', '_' and '.',
// without empty labels or a trailing dot.
func validHost(v []byte) bool {
	if len(v) == 0 || len(v) > 255 || v[0] == '.' || v[len(v)-1] == '.' {
		return false
	}
	for i, c := range v {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		case c == '.':
			if v[i-1] == '.' {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// parseALPN reads an ALPN extension: a non-empty list of non-empty names.
func parseALPN(data []byte) ([]byte, error) {
	r := reader{b: data}
	list := r.bytes(r.u16())
	if r.bad || len(r.b) != 0 || len(list) < 2 {
		return nil, ErrBadALPN
	}
	for b := list; len(b) > 0; {
		n := int(b[0])
		if n == 0 || 1+n > len(b) {
			return nil, ErrBadALPN
		}
		b = b[1+n:]
	}
	return list, nil
}
