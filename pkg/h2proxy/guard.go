package h2proxy

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
)

// Frame floods. The codec answers every SETTINGS, PRIORITY and
// WINDOW_UPDATE frame and reads every empty DATA or CONTINUATION frame, at
// a cost of ~1 µs of CPU each, however many a client sends; none of them
// asks for anything the proxy is there for. frameGuard watches the
// client's frames as the codec reads them (frame headers only, no
// copy) and holds the connection to a budget: each such frame spends one
// token; every request (a HEADERS frame) and every DATA frame the proxy
// sent the client (which the client's WINDOW_UPDATEs answer) earns
// floodCredit back, up to floodBudget, which is also where a connection
// starts. A connection whose tokens run out gets GOAWAY ENHANCE_YOUR_CALM
// (sent at the next frame boundary of what the codec writes, nothing after
// it) and is closed, and the frame type that exhausted the budget is
// counted (CountError "conn_ENHANCE_YOUR_CALM_flood_<type>").
//
// A legitimate client spends a few tokens on its SETTINGS, a PRIORITY
// tree or per-stream PRIORITY frames, and one WINDOW_UPDATE per few DATA
// frames it takes: far inside the budget.
const (
	floodBudget = 1000
	floodCredit = 10
)

// errFlood is what the codec reads once the budget ran out.
var errFlood = errors.New("http2: frame flood: connection closed with ENHANCE_YOUR_CALM")

// Frame types and flags (RFC 9113 6).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	framePriority     = 0x2
	frameSettings     = 0x4
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4

	frameHeaderLen = 9
)

// frameGuard follows the frame boundaries of the bytes the codec reads
// from a client. Only the codec's reading goroutine uses it.
type frameGuard struct {
	skip   int // preface bytes still to pass
	hdr    [frameHeaderLen]byte
	nh     int    // header bytes collected
	left   uint32 // payload bytes of the current frame still to pass
	typ    byte
	tokens int
	// settingsLen: the current frame is a SETTINGS frame with this
	// payload length (> 0), which h2conn.Read reads whole for
	// dedupSettings.
	settingsLen uint32
	maxStream   uint32 // highest stream a client HEADERS frame opened
	dataSeen    int64  // out.data when last looked at
	out         *frameWriter
	tripped     byte // the frame type that exhausted the budget
	flooded     bool

	hb headerCheck // the request header blocks (malformed.go)
}

func (g *frameGuard) init(out *frameWriter) {
	g.skip = len(clientPreface)
	g.tokens = floodBudget
	g.out = out
}

// scan follows p, the next bytes the codec reads. It returns false once
// the connection is over budget (the caller then counts the flood and
// queues the GOAWAY: goAway).
func (g *frameGuard) scan(p []byte) bool {
	for len(p) > 0 && !g.flooded {
		if g.skip > 0 {
			k := min(g.skip, len(p))
			g.skip -= k
			p = p[k:]
			continue
		}
		if g.left > 0 {
			k := uint32(min(uint64(g.left), uint64(len(p))))
			if g.hb.active {
				g.hb.payload(p[:k])
			}
			g.left -= k
			p = p[k:]
			if g.left == 0 && g.hb.active {
				g.hb.frameEnd()
			}
			continue
		}
		k := copy(g.hdr[g.nh:], p)
		g.nh += k
		p = p[k:]
		if g.nh < frameHeaderLen {
			break
		}
		g.nh = 0
		g.frame()
	}
	return !g.flooded
}

// frame accounts for the frame whose header was just read.
func (g *frameGuard) frame() {
	h := g.hdr[:]
	length := uint32(h[0])<<16 | uint32(h[1])<<8 | uint32(h[2])
	typ, flags := h[3], h[4]
	stream := binary.BigEndian.Uint32(h[5:]) & (1<<31 - 1)
	g.left, g.typ = length, typ
	g.settingsLen = 0
	costly := false
	if typ == frameHeaders || typ == frameContinuation {
		g.hb.frame(typ, flags, stream, length, stream > g.maxStream)
	}
	switch typ {
	case frameHeaders:
		if stream > g.maxStream {
			g.maxStream = stream
		}
		g.tokens = min(g.tokens+floodCredit, floodBudget)
	case frameSettings:
		costly = true
		if flags&flagAck == 0 && length > 0 && length%6 == 0 {
			g.settingsLen = length
		}
	case framePriority, frameWindowUpdate:
		costly = true
	case frameData:
		costly = length == 0 && flags&flagEndStream == 0
	case frameContinuation:
		costly = length == 0 && flags&flagEndHeaders == 0
	}
	if !costly {
		return
	}
	if g.out != nil {
		if d := g.out.data.Load(); d != g.dataSeen {
			g.tokens = int(min(int64(g.tokens)+(d-g.dataSeen)*floodCredit, floodBudget))
			g.dataSeen = d
		}
	}
	g.tokens--
	if g.tokens >= 0 {
		return
	}
	g.flooded = true
	g.tripped = typ
}

// goAway queues the GOAWAY ENHANCE_YOUR_CALM of a flooded connection.
// The caller counts the flood first, so whoever sees the GOAWAY also
// sees the count.
func (g *frameGuard) goAway() {
	if g.out != nil {
		g.out.goAway(g.maxStream, errCodeEnhanceYourCalm)
	}
}

// floodKind is the CountError kind of a flood of frames of type typ.
func floodKind(typ byte) string {
	switch typ {
	case frameSettings:
		return "conn_ENHANCE_YOUR_CALM_flood_settings"
	case framePriority:
		return "conn_ENHANCE_YOUR_CALM_flood_priority"
	case frameWindowUpdate:
		return "conn_ENHANCE_YOUR_CALM_flood_window_update"
	case frameData:
		return "conn_ENHANCE_YOUR_CALM_flood_empty_data"
	default:
		return "conn_ENHANCE_YOUR_CALM_flood_empty_continuation"
	}
}

const errCodeEnhanceYourCalm = 0xb

// Setting identifiers the codec checks (RFC 9113 6.5.2).
const (
	settingEnablePush        = 0x2
	settingInitialWindowSize = 0x4
	settingMaxFrameSize      = 0x5
)

// dedupSettings rewrites a SETTINGS payload that names a parameter more
// than once so that the codec, which refuses such a frame outright,
// applies it as RFC 9113 6.5.3 says: in order, the last value winning.
// Every entry but the last of a parameter gets an identifier no
// endpoint defines and the frame does not hold (from 0xf000 up), which
// the codec ignores (RFC 9113 6.5.2). An earlier value that is invalid on its own is kept, so
// that the codec still answers it with its connection error. Frames of
// more than 100 entries are left alone (the codec refuses them).
func dedupSettings(p []byte) {
	n := len(p) / 6
	if n < 2 || n > 100 {
		return
	}
	for i := 0; i < n-1; i++ {
		id := binary.BigEndian.Uint16(p[6*i:])
		later := false
		for j := i + 1; j < n && !later; j++ {
			later = binary.BigEndian.Uint16(p[6*j:]) == id
		}
		if later && settingValid(id, binary.BigEndian.Uint32(p[6*i+2:])) {
			binary.BigEndian.PutUint16(p[6*i:], unusedSetting(p, n))
		}
	}
}

// unusedSetting returns an identifier from 0xf000 up that none of the n
// entries of p holds (n <= 100: one is found within 101 tries).
func unusedSetting(p []byte, n int) uint16 {
	for id := uint16(0xf000); ; id++ {
		used := false
		for j := 0; j < n && !used; j++ {
			used = binary.BigEndian.Uint16(p[6*j:]) == id
		}
		if !used {
			return id
		}
	}
}

func settingValid(id uint16, v uint32) bool {
	switch id {
	case settingEnablePush:
		return v <= 1
	case settingInitialWindowSize:
		return v <= 1<<31-1
	case settingMaxFrameSize:
		return v >= 1<<14 && v <= 1<<24-1
	}
	return true
}

// frameWriter follows the frame boundaries of what the codec writes to a
// client (under the coalescer's lock): it counts the DATA frames, and
// puts the frames of the proxy's own (a RST_STREAM of the header checks,
// the flood guard's GOAWAY) at the next boundary; after a GOAWAY it drops
// everything the codec writes.
type frameWriter struct {
	hdr     [frameHeaderLen]byte
	nh      int
	left    uint32
	data    atomic.Int64 // DATA frames written
	due     []byte       // frames to send at the next boundary (coalescer.mu)
	sealDue bool         // due ends with a GOAWAY
	sealed  bool         // a GOAWAY is queued: nothing more goes out
	w       *coalescer
}

// goAway queues a GOAWAY (last stream, code) after the frame being
// written, and nothing after it.
func (f *frameWriter) goAway(last uint32, code uint32) {
	b := make([]byte, frameHeaderLen+8)
	b[2] = 8
	b[3] = frameGoAway
	binary.BigEndian.PutUint32(b[9:], last&(1<<31-1))
	binary.BigEndian.PutUint32(b[13:], code)
	f.w.injectAtBoundary(b, true)
}

// resetStream queues a RST_STREAM after the frame being written.
func (f *frameWriter) resetStream(stream, code uint32) {
	f.w.injectAtBoundary(appendRSTStream(make([]byte, 0, rstStreamFrameSize), stream, code), false)
}

// cut returns how many bytes of p belong to frames started before the
// frames due may go (all of p when none are), following the boundaries
// across p.
func (f *frameWriter) cut(p []byte) int {
	i := 0
	for i < len(p) {
		if f.left > 0 {
			k := int(min(uint64(f.left), uint64(len(p)-i)))
			f.left -= uint32(k)
			i += k
			continue
		}
		if f.nh == 0 && f.due != nil {
			return i
		}
		k := copy(f.hdr[f.nh:], p[i:])
		f.nh += k
		i += k
		if f.nh == frameHeaderLen {
			f.nh = 0
			f.left = uint32(f.hdr[0])<<16 | uint32(f.hdr[1])<<8 | uint32(f.hdr[2])
			if f.hdr[3] == frameData {
				f.data.Add(1)
			}
		}
	}
	return i
}

// atBoundary reports whether the bytes written so far end with a whole
// frame.
func (f *frameWriter) atBoundary() bool { return f.nh == 0 && f.left == 0 }
