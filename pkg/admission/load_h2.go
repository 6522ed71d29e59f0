package admission

import (
	"gopkg.in/yaml.v3"
)

// HTTP/2 settings of a service (used by pkg/h2proxy).
const (
	UpstreamAuto  = "auto"  // the client's protocol (h2c for HTTP/2 clients)
	UpstreamHTTP1 = "http1" // HTTP/1.1 whatever the client spoke
	UpstreamH2C   = "h2c"   // HTTP/2 prior knowledge (cleartext)

	DefaultDenyGRPCStatus = 8 // RESOURCE_EXHAUSTED

	DefaultH2MaxConcurrentStreams = 128
	DefaultH2MaxFrameSize         = 16 << 10
	DefaultH2HeaderTableSize      = 4096
	DefaultH2StreamWindow         = 64 << 10
)

// H2Limits bound a service's HTTP/2 client connections. The header block
// of a stream is bounded by Limits.MaxHeaderBytes, its field count by
// Limits.MaxHeaders.
type H2Limits struct {
	MaxConcurrentStreams uint32 // SETTINGS_MAX_CONCURRENT_STREAMS
	MaxFrameSize         uint32 // SETTINGS_MAX_FRAME_SIZE
	HeaderTableSize      uint32 // SETTINGS_HEADER_TABLE_SIZE (HPACK)
	StreamWindow         uint32 // per-stream flow-control window: body held before admission
}

var h2LimitKeys = []string{"h2_max_concurrent_streams", "h2_max_frame_size", "h2_header_table_size", "h2_stream_window"}

type h2Settings struct {
	streams, frame, table, window *int64
}

// h2Limit parses one of the h2_* keys of `limits`.
func (l *loader) h2Limit(f kv, fc string, s *h2Settings) {
	switch f.key {
	case "h2_max_concurrent_streams":
		if n, ok := l.integer(f.v, fc, 1, 10000); ok {
			s.streams = &n
		}
	case "h2_max_frame_size": // RFC 9113 6.5.2: 2^14 .. 2^24-1
		if n, ok := l.size(f.v, fc, 1<<24-1); ok {
			if n < 16<<10 {
				l.errorf(f.v, "%s: at least 16384 (RFC 9113), got %d", fc, n)
			} else {
				s.frame = &n
			}
		}
	case "h2_header_table_size":
		if n, ok := l.size(f.v, fc, 1<<20); ok && l.positive(f.v, fc, n) {
			s.table = &n
		}
	case "h2_stream_window":
		if n, ok := l.size(f.v, fc, 1<<30); ok {
			if n < 1<<10 {
				l.errorf(f.v, "%s: at least 1KiB, got %d", fc, n)
			} else {
				s.window = &n
			}
		}
	}
}

func (s *h2Settings) resolve(def *h2Settings) H2Limits {
	return H2Limits{
		MaxConcurrentStreams: uint32(pick(int64(DefaultH2MaxConcurrentStreams), s.streams, def.streams)),
		MaxFrameSize:         uint32(pick(int64(DefaultH2MaxFrameSize), s.frame, def.frame)),
		HeaderTableSize:      uint32(pick(int64(DefaultH2HeaderTableSize), s.table, def.table)),
		StreamWindow:         uint32(pick(int64(DefaultH2StreamWindow), s.window, def.window)),
	}
}

// escapedSlashes parses `escaped_slashes`.
func (l *loader) escapedSlashes(v *yaml.Node, c string, s *serviceSettings) {
	m, ok := l.str(v, c)
	if !ok {
		return
	}
	switch m {
	case EscapedSlashesReject, EscapedSlashesDecode:
		s.escapedSlashes = &m
	default:
		l.errorf(v, "%s: want reject or decode, got %q", c, short(m))
	}
}

// upstreamProtocol parses `upstream_protocol`.
func (l *loader) upstreamProtocol(v *yaml.Node, c string, s *serviceSettings) {
	m, ok := l.str(v, c)
	if !ok {
		return
	}
	switch m {
	case UpstreamAuto, UpstreamHTTP1, UpstreamH2C:
		s.upstreamProtocol = &m
	default:
		l.errorf(v, "%s: want auto, http1 or h2c, got %q", c, short(m))
	}
}
