package h2proxy

import (
	"encoding/binary"

	"golang.org/x/net/http2/hpack"
)

// Malformed requests (RFC 9113 8.2.2): a request header block with a
// connection-specific field (connection, keep-alive, proxy-connection,
// transfer-encoding, upgrade) or a TE field other than "trailers" must be
// answered with a stream error PROTOCOL_ERROR. The codec finds the same
// fields but answers 400 on the stream instead, and never runs the
// proxy's handler for it. headerCheck decodes every header block the
// client sends beside the codec (its own HPACK decoder, same table size
// and string bound, so the two tables stay equal) and, for a request
// that has such a field, has the proxy send RST_STREAM PROTOCOL_ERROR at
// once (before anything the codec writes for the stream) and feeds the
// codec a RST_STREAM CANCEL for it right after the block, so that the
// codec ends the stream: its 400, if written before, follows the reset and
// the client ignores it. Counted as
// "stream_PROTOCOL_ERROR_connection_specific_field". Such a request never
// reaches admission or the upstream either way.
//
// A block the decoder cannot decode ends the checks of the connection
// (the codec answers that block with a connection error).
type headerCheck struct {
	dec    *hpack.Decoder
	active bool // the current frame carries a header block fragment

	// The current frame's layout.
	padded  bool   // the first payload byte is the pad length
	skip    uint32 // bytes before the fragment (pad length, priority)
	feed    uint32 // fragment bytes still to decode
	left    uint32 // payload bytes of the frame still to come
	endHdrs bool
	request bool // the block opens a stream (not trailers)

	stream uint32
	bad    bool // the block has a field RFC 9113 8.2.2 forbids
	tes    int
	broken bool // the decoder failed: no more checks

	// reset, when set, is a stream the checks ended: the frames to send
	// and to feed the codec are due.
	reset uint32
}

var connSpecific = [...]string{"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"}

// init prepares the decoder: the codec's dynamic table bound and its
// string bound (the header list size).
func (c *headerCheck) init(tableSize uint32, maxString int) {
	c.dec = hpack.NewDecoder(tableSize, c.field)
	c.dec.SetMaxStringLength(maxString)
}

func (c *headerCheck) field(f hpack.HeaderField) {
	if c.bad || !c.request {
		return
	}
	if f.Name == "te" {
		c.tes++
		c.bad = c.tes > 1 || (f.Value != "trailers" && f.Value != "")
		return
	}
	for _, n := range connSpecific {
		if f.Name == n {
			c.bad = true
			return
		}
	}
}

// frame starts a HEADERS or CONTINUATION frame (newStream: a HEADERS
// frame opening a stream).
func (c *headerCheck) frame(typ, flags byte, stream, length uint32, newStream bool) {
	c.active = false
	if c.dec == nil || c.broken {
		return
	}
	if typ == frameHeaders {
		c.stream, c.request, c.bad, c.tes = stream, newStream, false, 0
		c.padded = flags&flagPadded != 0
		c.skip = 0
		if flags&flagPriority != 0 {
			c.skip = 5
		}
	} else {
		if stream != c.stream {
			c.broken = true // the codec ends the connection
			return
		}
		c.padded, c.skip = false, 0
	}
	c.left, c.feed = length, length-min(length, c.skip)
	c.endHdrs = flags&flagEndHeaders != 0
	c.active = true
	if length == 0 && c.endHdrs {
		c.frameEnd()
	}
}

// payload decodes the fragment bytes of p, the next payload bytes.
func (c *headerCheck) payload(p []byte) {
	for len(p) > 0 && !c.broken {
		if c.padded {
			pad := uint32(p[0])
			c.padded = false
			p = p[1:]
			c.left--
			if pad+c.skip > c.left {
				c.broken = true // the codec ends the connection
				return
			}
			c.feed = c.left - c.skip - pad
			continue
		}
		if c.skip > 0 {
			k := min(c.skip, uint32(len(p)))
			c.skip -= k
			c.left -= k
			p = p[k:]
			continue
		}
		k := min(c.feed, uint32(len(p)))
		if k > 0 {
			if _, err := c.dec.Write(p[:k]); err != nil {
				c.broken = true
				return
			}
		}
		c.feed -= k
		c.left -= uint32(len(p))
		return // the rest is padding
	}
}

// frameEnd ends a frame; at the end of a block, a bad request is due
// its reset.
func (c *headerCheck) frameEnd() {
	c.active = false
	if !c.endHdrs || c.broken {
		return
	}
	if err := c.dec.Close(); err != nil {
		c.broken = true
		return
	}
	if c.bad {
		c.reset = c.stream
	}
}

const (
	flagPadded   = 0x8
	flagPriority = 0x20

	frameRSTStream     = 0x3
	errCodeProtocol    = 0x1
	errCodeCancel      = 0x8
	rstStreamFrameSize = frameHeaderLen + 4
)

// appendRSTStream appends a RST_STREAM frame.
func appendRSTStream(b []byte, stream, code uint32) []byte {
	b = append(b, 0, 0, 4, frameRSTStream, 0)
	b = binary.BigEndian.AppendUint32(b, stream&(1<<31-1))
	return binary.BigEndian.AppendUint32(b, code)
}
