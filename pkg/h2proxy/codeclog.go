package h2proxy

import (
	"bytes"
	"log/slog"
	"sync"
	"time"
)

// codecLog is the HTTP/2 codec's error log (http.Server.ErrorLog's
// writer): each line goes to the proxy's logger, at most codecLogBurst
// lines per codecLogWindow; the lines dropped past that are counted and
// their number logged with the next line that passes. A handler's panic
// ("http2: panic serving ...") is logged at error level, everything else
// (connection errors a client provokes at will) at warn. A panic is also
// counted through count ("handler_panic"), so that it shows in the
// metrics however busy the log.
type codecLog struct {
	mu      sync.Mutex
	log     func() *slog.Logger
	count   func(kind string)
	now     func() time.Time
	start   time.Time // of the current window
	n       int       // lines logged in the window
	dropped int       // lines dropped since the last logged one
}

const (
	codecLogBurst  = 10
	codecLogWindow = time.Second
)

func (l *codecLog) Write(p []byte) (int, error) {
	panicked := bytes.Contains(p, []byte("panic serving"))
	if panicked && l.count != nil {
		l.count("handler_panic")
	}
	l.mu.Lock()
	now := l.now()
	if now.Sub(l.start) >= codecLogWindow || now.Before(l.start) {
		l.start, l.n = now, 0
	}
	if l.n >= codecLogBurst {
		l.dropped++
		l.mu.Unlock()
		return len(p), nil
	}
	l.n++
	dropped := l.dropped
	l.dropped = 0
	l.mu.Unlock()
	lg := l.log()
	attrs := []any{"line", string(bytes.TrimRight(p, "\n"))} // only for a line that is logged
	if dropped > 0 {
		attrs = append(attrs, "suppressed", dropped)
	}
	if panicked {
		lg.Error("http2 codec: handler panic", attrs...)
	} else {
		lg.Warn("http2 codec", attrs...)
	}
	return len(p), nil
}
