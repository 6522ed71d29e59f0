package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/accesslog"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

// NewLogger builds the process logger (text, JSON or combined on w).
func NewLogger(format, level string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	switch strings.ToLower(level) {
	case "debug":
		lv = slog.LevelDebug
	case "info":
		lv = slog.LevelInfo
	case "warn", "warning":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		jopts := *opts
		jopts.ReplaceAttr = durationString
		return slog.New(slog.NewJSONHandler(w, &jopts)), nil
	case "combined":
		return slog.New(accesslog.NewCombined(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text, json or combined", format)
}

// durationString writes a time.Duration attribute of a JSON log line as
// a Go duration string ("30s", "1.5ms") instead of slog's default, a raw
// count of nanoseconds that reads as a bare number with no unit.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// Run starts a node for pol, serves until ctx ends, SIGTERM/SIGINT, a
// takeover or a runtime failure, reloads on SIGHUP, and drains (bounded by
// drain). It returns nil after a clean stop and the start or runtime
// failure otherwise.
func Run(ctx context.Context, pol *admission.Policy, opts Options, drain time.Duration) error {
	log := opts.Log
	sig := notifySignals()
	defer sig.stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n, err := Start(ctx, pol, opts)
	if err != nil {
		log.Error("start failed", "error", err.Error())
		return fmt.Errorf("start: %w", err)
	}
	log.Info("rl-tproxy running", "version", opts.Version, "policy", opts.Policy, "summary", pol.Summary())
	var failure error
loop:
	for {
		select {
		case <-sig.hup:
			n.RequestReload() // never on this loop: SIGTERM stays prompt
		case s := <-sig.term:
			log.Info("shutting down", "signal", s.String(), "drain_timeout", drain.String())
			break loop
		case <-ctx.Done():
			log.Info("shutting down", "reason", "cancelled", "drain_timeout", drain.String())
			break loop
		case <-n.TakenOver():
			log.Info("shutting down", "reason", "taken over", "drain_timeout", drain.String())
			break loop
		case err := <-n.Failed():
			log.Error("runtime failure", "error", err.Error())
			failure = fmt.Errorf("runtime failure: %w", err)
			break loop
		}
	}
	dctx, dcancel := context.WithTimeout(context.Background(), drain)
	defer dcancel()
	if err := n.Shutdown(dctx); err != nil {
		log.Warn("shutdown incomplete", "error", err.Error())
	}
	log.Info("stopped")
	return failure
}
