package wire

import (
	"crypto/cipher"
	"crypto/rand"
	"fmt"
	"slices"

	"golang.org/x/crypto/chacha20poly1305"
)

// Key seals and opens datagrams of one credential (key_id + 32-byte secret)
// with XChaCha20-Poly1305; the 52-byte header is the associated data. A Key
// is safe for concurrent use.
type Key struct {
	id   uint32
	aead cipher.AEAD
}

// NewKey builds a Key from a credential's key_id and secret.
func NewKey(keyID uint32, secret [KeyLen]byte) (*Key, error) {
	a, err := chacha20poly1305.NewX(secret[:])
	if err != nil {
		return nil, fmt.Errorf("wire: key %d: %w", keyID, err)
	}
	return &Key{id: keyID, aead: a}, nil
}

// ID is the key_id this key seals with and accepts.
func (k *Key) ID() uint32 { return k.id }

// String never shows the secret.
func (k *Key) String() string { return fmt.Sprintf("wire.Key{id: %d, secret: redacted}", k.id) }

// GoString never shows the secret.
func (k *Key) GoString() string { return k.String() }

// Seal sets h.Kind from b, h.KeyID from k and a fresh random h.Nonce, then
// appends the sealed datagram (header, ciphertext, tag) to dst. With cap(dst)
// − len(dst) ≥ MaxDatagram it does not allocate. The caller sets Flags,
// Attempt, TTLms, RequestID and Timestamp.
func (k *Key) Seal(dst []byte, h *Header, b Body) ([]byte, error) {
	if _, err := rand.Read(h.Nonce[:]); err != nil {
		return dst, fmt.Errorf("wire: nonce: %w", err)
	}
	return k.SealNonce(dst, h, b)
}

// SealNonce is Seal with the caller's h.Nonce (deterministic tests and
// examples). Never reuse a nonce with the same key in production.
func (k *Key) SealNonce(dst []byte, h *Header, b Body) ([]byte, error) {
	h.Kind = b.Kind()
	h.KeyID = k.id
	start := len(dst)
	dst = growHeader(dst, h)
	out, err := b.AppendBody(dst)
	if err != nil {
		return dst[:start], err
	}
	return k.sealTail(out, start)
}

// SealBody seals an already encoded plaintext body of kind h.Kind with the
// caller's h.Nonce (used to resend a cached answer under a new header).
func (k *Key) SealBody(dst []byte, h *Header, body []byte) ([]byte, error) {
	if h.Kind < KindRateRequest || h.Kind > KindCompletion {
		return dst, ErrKind
	}
	if len(body) > MaxBody {
		return dst, ErrTooLarge
	}
	h.KeyID = k.id
	start := len(dst)
	dst = growHeader(dst, h)
	dst = append(dst, body...)
	return k.sealTail(dst, start)
}

func growHeader(dst []byte, h *Header) []byte {
	start := len(dst)
	if cap(dst)-start >= HeaderLen {
		dst = dst[:start+HeaderLen]
	} else {
		var z [HeaderLen]byte
		dst = append(dst, z[:]...)
	}
	h.Put(dst[start:])
	return dst
}

// sealTail encrypts dst[start+HeaderLen:] in place and appends the tag.
func (k *Key) sealTail(dst []byte, start int) ([]byte, error) {
	if len(dst)-start+TagLen > MaxDatagram {
		return dst[:start], ErrTooLarge
	}
	dst = slices.Grow(dst, TagLen) // no-op when the caller's buffer is big enough
	hdr := dst[start : start+HeaderLen]
	pt := dst[start+HeaderLen:]
	out := k.aead.Seal(pt[:0], hdr[28:HeaderLen], pt, hdr)
	return dst[:start+HeaderLen+len(out)], nil
}

// Open parses the header of pkt into h, checks that it is for this key and
// decrypts the body in place (pkt is overwritten). It returns the plaintext
// body, aliasing pkt. It does not check the timestamp (see CheckTime).
func (k *Key) Open(pkt []byte, h *Header) ([]byte, error) {
	if err := h.Decode(pkt); err != nil {
		return nil, err
	}
	if h.KeyID != k.id {
		return nil, ErrKeyID
	}
	ct := pkt[HeaderLen:]
	pt, err := k.aead.Open(ct[:0], pkt[28:HeaderLen], ct, pkt[:HeaderLen])
	if err != nil {
		return nil, ErrAuth
	}
	return pt, nil
}

// OpenBody opens pkt (see Open), checks that its kind matches b and decodes
// the body into b.
func (k *Key) OpenBody(pkt []byte, h *Header, b Body) error {
	pt, err := k.Open(pkt, h)
	if err != nil {
		return err
	}
	if h.Kind != b.Kind() {
		return ErrKind
	}
	return b.DecodeBody(pt)
}

// DecodeBody decodes a plaintext body of kind k into the matching one of the
// given structs (nil ones are not used). It is a convenience for receivers
// that accept several kinds.
func DecodeBody(k Kind, pt []byte, req *RateRequest, resp *RateResponse, rep *LatencyReport, comp *Completion) error {
	var b Body
	switch {
	case k == KindRateRequest && req != nil:
		b = req
	case k == KindRateResponse && resp != nil:
		b = resp
	case k == KindLatencyReport && rep != nil:
		b = rep
	case k == KindCompletion && comp != nil:
		b = comp
	default:
		return ErrKind
	}
	return b.DecodeBody(pt)
}
