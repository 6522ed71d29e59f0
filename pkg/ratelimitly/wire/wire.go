// Package wire encodes, decodes, seals and opens RateLimitly wire v1
// datagrams (see docs/protocol.md, the normative description).
//
// Encoding appends into caller buffers and decoding fills caller structs whose
// slices are reused, so neither allocates in steady state. Decoded byte slices
// (labels, services, buckets) alias the buffer they were decoded from: copy
// them if they must outlive it. Every decoder is strict: exact lengths, no
// trailing bytes, bounded counts and string lengths; malformed input returns
// one of the typed errors below and never panics.
package wire

import (
	"encoding/binary"
	"errors"
	"time"
)

// Protocol constants.
const (
	Magic0      = 0x52 // 'R'
	Magic1      = 0x4C // 'L'
	Version     = 1
	HeaderLen   = 52   // bytes of the clear, authenticated header
	NonceLen    = 24   // XChaCha20-Poly1305 nonce
	TagLen      = 16   // Poly1305 tag, last in the datagram
	KeyLen      = 32   // credential secret
	MaxDatagram = 1400 // largest datagram a sender may produce or a receiver accepts
	MaxBody     = MaxDatagram - HeaderLen - TagLen
	MinDatagram = HeaderLen + TagLen
	MaxCount    = 32   // guards, resources, report entries
	MaxLabel    = 256  // label bytes (0 = no label)
	MaxName     = 1024 // service and bucket bytes (at least 1)
	// DefaultSkew is the clock skew allowance of the timestamp window.
	DefaultSkew = 30 * time.Second
)

// Kind is the datagram kind (header byte 3).
type Kind uint8

// Datagram kinds.
const (
	KindRateRequest   Kind = 1
	KindRateResponse  Kind = 2
	KindLatencyReport Kind = 3
	KindCompletion    Kind = 4
)

func (k Kind) String() string {
	switch k {
	case KindRateRequest:
		return "RATE_REQUEST"
	case KindRateResponse:
		return "RATE_RESPONSE"
	case KindLatencyReport:
		return "LATENCY_REPORT"
	case KindCompletion:
		return "COMPLETION"
	}
	return "UNKNOWN"
}

// Header flag bits (header byte 4). Other bits are reserved: senders set
// them to 0 and receivers ignore them.
const (
	FlagSteering uint8 = 1 << 0 // responses: 1 = stay, 0 = move to another source port
	FlagReplay   uint8 = 1 << 1 // this request is a replay of an earlier attempt
)

// Status values of a RATE_RESPONSE.
const (
	StatusOK          uint8 = 0
	StatusMalformed   uint8 = 1
	StatusOverQuota   uint8 = 2
	StatusUnavailable uint8 = 3
)

// Completion decisions.
const (
	DecisionAllow uint8 = 1
	DecisionDeny  uint8 = 2
)

// Typed errors. Decoders and Open return exactly these values (compare with
// errors.Is or ==); they never allocate.
var (
	ErrMagic         = errors.New("wire: bad magic")
	ErrVersion       = errors.New("wire: unsupported version")
	ErrKind          = errors.New("wire: unknown or unexpected kind")
	ErrTruncated     = errors.New("wire: truncated")
	ErrTrailing      = errors.New("wire: trailing bytes")
	ErrCount         = errors.New("wire: count out of range")
	ErrStringTooLong = errors.New("wire: string too long")
	ErrStringEmpty   = errors.New("wire: empty service or bucket")
	ErrValue         = errors.New("wire: invalid field value")
	ErrTooLarge      = errors.New("wire: datagram larger than 1400 bytes")
	ErrAuth          = errors.New("wire: authentication failed")
	ErrStale         = errors.New("wire: timestamp outside the accepted window")
	ErrKeyID         = errors.New("wire: key_id does not match the key")
	ErrBuffer        = errors.New("wire: destination buffer too small")
)

// Header is the 52-byte clear header, authenticated as associated data.
type Header struct {
	Kind      Kind
	Flags     uint8
	Attempt   uint8
	TTLms     uint16
	KeyID     uint32
	RequestID uint64
	Timestamp uint64 // unix milliseconds
	Nonce     [NonceLen]byte
}

// Steering reports the steering_feedback bit.
func (h *Header) Steering() bool { return h.Flags&FlagSteering != 0 }

// Replay reports the replay bit.
func (h *Header) Replay() bool { return h.Flags&FlagReplay != 0 }

// Put writes the header into b[:HeaderLen]; b must be at least HeaderLen long.
func (h *Header) Put(b []byte) {
	_ = b[HeaderLen-1]
	b[0], b[1], b[2] = Magic0, Magic1, Version
	b[3] = byte(h.Kind)
	b[4] = h.Flags
	b[5] = h.Attempt
	binary.BigEndian.PutUint16(b[6:], h.TTLms)
	binary.BigEndian.PutUint32(b[8:], h.KeyID)
	binary.BigEndian.PutUint64(b[12:], h.RequestID)
	binary.BigEndian.PutUint64(b[20:], h.Timestamp)
	copy(b[28:HeaderLen], h.Nonce[:])
}

// Decode parses the clear header of a whole datagram without opening it:
// it checks the datagram size, magic, version and kind. Use it to find the
// key (KeyID) before Open. Nothing in it is trustworthy before Open succeeds.
func (h *Header) Decode(pkt []byte) error {
	if len(pkt) > MaxDatagram {
		return ErrTooLarge
	}
	if len(pkt) < MinDatagram {
		return ErrTruncated
	}
	if pkt[0] != Magic0 || pkt[1] != Magic1 {
		return ErrMagic
	}
	if pkt[2] != Version {
		return ErrVersion
	}
	k := Kind(pkt[3])
	if k < KindRateRequest || k > KindCompletion {
		return ErrKind
	}
	h.Kind = k
	h.Flags = pkt[4]
	h.Attempt = pkt[5]
	h.TTLms = binary.BigEndian.Uint16(pkt[6:])
	h.KeyID = binary.BigEndian.Uint32(pkt[8:])
	h.RequestID = binary.BigEndian.Uint64(pkt[12:])
	h.Timestamp = binary.BigEndian.Uint64(pkt[20:])
	copy(h.Nonce[:], pkt[28:HeaderLen])
	return nil
}

// maxTimestamp bounds the wire timestamp before it is used as an int64 in
// the window arithmetic (larger values would overflow it).
const maxTimestamp = 1 << 62

// CheckTime applies the timestamp window: a datagram is accepted when
// now − (ttl_ms + skew) ≤ timestamp ≤ now + skew, in unix milliseconds.
func CheckTime(h *Header, now time.Time, skew time.Duration) error {
	n := now.UnixMilli()
	s := skew.Milliseconds()
	ts := int64(h.Timestamp)
	if h.Timestamp > maxTimestamp || ts > n+s || ts < n-(int64(h.TTLms)+s) {
		return ErrStale
	}
	return nil
}
