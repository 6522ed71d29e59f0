package admission

import (
	"strings"
	"testing"
)

// TestLoadH2Settings: upstream_protocol, the h2_* limits and
// deny.grpc_status, their defaults and inheritance from defaults.
func TestLoadH2Settings(t *testing.T) {
	p := ptLoad(t, ptEmbedded+`defaults:
  upstream_protocol: http1
  limits: {h2_max_concurrent_streams: 10}
  deny: {grpc_status: 14}
services:
  - name: inherits
    listen: 127.0.0.1:8080
    upstream: 127.0.0.1:8081
  - name: own
    listen: 127.0.0.1:8082
    upstream: 127.0.0.1:8083
    upstream_protocol: h2c
    limits: {h2_max_frame_size: 32KiB, h2_header_table_size: 512, h2_stream_window: 1MiB}
    locations:
      - match: {path_prefix: /a}
        deny: {grpc_status: 7}
      - match: {path_prefix: /b}
`)
	in, own := p.Services[0], p.Services[1]
	if in.UpstreamProtocol != UpstreamHTTP1 || in.H2 != (H2Limits{10, DefaultH2MaxFrameSize, DefaultH2HeaderTableSize, DefaultH2StreamWindow}) || in.Locations[0].Deny.GRPCStatus != 14 {
		t.Errorf("inherits: %q %+v %+v", in.UpstreamProtocol, in.H2, in.Locations[0].Deny)
	}
	if own.UpstreamProtocol != UpstreamH2C || own.H2 != (H2Limits{10, 32 << 10, 512, 1 << 20}) {
		t.Errorf("own: %q %+v", own.UpstreamProtocol, own.H2)
	}
	if own.Locations[0].Deny.GRPCStatus != 7 || own.Locations[1].Deny.GRPCStatus != 14 {
		t.Errorf("grpc_status: %d %d", own.Locations[0].Deny.GRPCStatus, own.Locations[1].Deny.GRPCStatus)
	}
	d := ptLoad(t, ptEmbedded+ptService)
	if s := d.Services[0]; s.UpstreamProtocol != UpstreamAuto || s.Locations[0].Deny.GRPCStatus != DefaultDenyGRPCStatus ||
		s.H2 != (H2Limits{DefaultH2MaxConcurrentStreams, DefaultH2MaxFrameSize, DefaultH2HeaderTableSize, DefaultH2StreamWindow}) {
		t.Errorf("defaults: %q %+v", s.UpstreamProtocol, s.H2)
	}
}

func TestLoadH2Errors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"    upstream_protocol: h3\n", "want auto, http1 or h2c"},
		{"    limits: {h2_max_frame_size: 1000}\n", "at least 16384"},
		{"    limits: {h2_max_frame_size: 32MiB}\n", "h2_max_frame_size"},
		{"    limits: {h2_max_concurrent_streams: 0}\n", "h2_max_concurrent_streams"},
		{"    limits: {h2_stream_window: 10}\n", "at least 1KiB"},
		{"    limits: {h2_window: 10}\n", "h2_window"},
		{"    deny: {grpc_status: 0}\n", "grpc_status"},
		{"    limits: {h2_header_table_size: 0}\n", "h2_header_table_size"},
		{"    deny: {grpc_status: 17}\n", "grpc_status"},
	} {
		_, err := Load(ptWrite(t, ptEmbedded+ptService+tc.yaml, ""))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// TestLoadEscapedSlashes: escaped_slashes defaults to reject, is
// inherited from defaults and overridden per service; other values are
// errors.
func TestLoadEscapedSlashes(t *testing.T) {
	p := ptLoad(t, ptEmbedded+`defaults:
  escaped_slashes: decode
services:
  - name: inherits
    listen: 127.0.0.1:8080
    upstream: 127.0.0.1:8081
  - name: own
    listen: 127.0.0.1:8082
    upstream: 127.0.0.1:8083
    escaped_slashes: reject
`)
	if got := p.Services[0].EscapedSlashes; got != EscapedSlashesDecode {
		t.Errorf("inherited: %q, want decode", got)
	}
	if got := p.Services[1].EscapedSlashes; got != EscapedSlashesReject {
		t.Errorf("own: %q, want reject", got)
	}
	if got := ptLoad(t, ptEmbedded+ptService).Services[0].EscapedSlashes; got != EscapedSlashesReject {
		t.Errorf("default: %q, want reject", got)
	}
	for _, bad := range []string{"keep", `"true"`, "Decode"} {
		_, err := Load(ptWrite(t, ptEmbedded+ptService+"    escaped_slashes: "+bad+"\n", ""))
		if err == nil || !strings.Contains(err.Error(), "want reject or decode") {
			t.Errorf("%q: err %v", bad, err)
		}
	}
}
