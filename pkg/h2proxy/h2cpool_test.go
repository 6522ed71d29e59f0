package h2proxy

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// TestH2CPoolStreamLimit: streams beyond the upstream's
// SETTINGS_MAX_CONCURRENT_STREAMS go to more connections instead of
// queueing behind the full one; every stream completes; a closed pool
// refuses streams.
func TestH2CPoolStreamLimit(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	opened := 0
	release := make(chan struct{})
	started := make(chan struct{}, 16)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	us := &http.Server{Protocols: &p, HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 2},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/block" {
				started <- struct{}{}
				<-release
			}
			_, _ = io.WriteString(w, "ok")
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				mu.Lock()
				opened++
				mu.Unlock()
			}
		}}
	go func() { _ = us.Serve(ln) }()
	defer us.Close()
	var u upstreams
	u.init()
	up, err := u.get(&exchange.Service{Name: "p", Upstream: ln.Addr().String(), UpstreamProtocol: ProtoH2C}, &exchange.Config{})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) error {
		req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+path, nil)
		res, err := up.rt.RoundTrip(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if b, err := io.ReadAll(res.Body); err != nil || string(b) != "ok" {
			return errors.Join(errors.New("bad body "+string(b)), err)
		}
		return nil
	}
	// First a stream alone: the connection has the upstream's SETTINGS.
	if err := get("/"); err != nil {
		t.Fatal(err)
	}
	// Four streams that stay open: two fill the first connection (its
	// SETTINGS are known), the other two need a second one. (A new
	// connection takes streams up to the default limit until its SETTINGS
	// arrive, as http.Transport's do.)
	const n = 4
	errs := make(chan error, n)
	for range n {
		go func() { errs <- get("/block") }()
	}
	got := 0
	testkit.WaitFor(t, "all streams to reach the upstream at once", func() bool {
		for {
			select {
			case <-started:
				got++
			default:
				return got == n
			}
		}
	})
	close(release)
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	mu.Lock()
	if opened != 2 {
		t.Errorf("connections opened: %d, want 2 (4 streams, 2 per connection)", opened)
	}
	mu.Unlock()
	u.close()
	req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/", nil)
	if _, err := up.rt.RoundTrip(req); !errors.Is(err, errPoolClosed) {
		t.Errorf("closed pool: %v", err)
	}
}
