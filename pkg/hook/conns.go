package hook

import (
	"context"
	"log/slog"

	"github.com/rl-tproxy/rl-tproxy/pkg/accesslog"
	"github.com/rl-tproxy/rl-tproxy/pkg/passthrough"
)

// ObserveConn counts a connection the passthrough relay ended and writes
// its access line when the Hook never saw it (opaque connections, rejects,
// malformed ClientHellos; an admitted TLS connection's line comes from
// Done).
func (g *Gate) ObserveConn(ev *passthrough.Event) {
	svc := "-"
	if ev.Service != nil {
		svc = ev.Service.Name
	}
	g.m.Connection(svc, ev.Kind.String(), ev.Action.String()).Inc()
	if ev.Admitted || !g.access.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	attrs := []slog.Attr{
		slog.String("service", svc),
		slog.String(accesslog.Remote, ev.Remote.String()),
		slog.String(accesslog.Proto, ev.Kind.String()),
		slog.String("action", ev.Action.String()),
		slog.Float64("duration_ms", float64(ev.End.Sub(ev.Start).Microseconds())/1000),
		slog.Int64("bytes_in", ev.BytesIn),
		slog.Int64(accesslog.BytesOut, ev.BytesOut),
	}
	if len(ev.SNI) > 0 {
		attrs = append(attrs, slog.String("sni", string(ev.SNI)))
	}
	if ev.Err != nil {
		attrs = append(attrs, slog.String("error", ev.Err.Error()))
	}
	g.access.LogAttrs(context.Background(), slog.LevelInfo, accesslog.Message, attrs...)
}
