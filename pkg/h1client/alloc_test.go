//go:build !race

// Allocation tests (testing.AllocsPerRun): meaningless under -race, so
// this file is left out of the race run; test/allocs.sh runs every Test
// here (each has "Alloc" in its name) without it.

package h1client_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/h1client"
)

// TestRoundTripAllocs: a steady-state exchange on a pooled connection
// allocates what the caller keeps (the response with its body, the
// header map, its values, one string of the head's bytes) and, for a
// request whose context can end, the context's watch; the connection,
// its buffers and the request head cost nothing.
func TestRoundTripAllocs(t *testing.T) {
	for _, br := range benchResponses {
		addr := benchUpstream(t, br.resp)
		p := h1client.New(h1client.Config{Addr: addr, MaxIdle: 4})
		t.Cleanup(p.CloseIdleConnections)
		buf := make([]byte, 512)
		exchange := func(req *http.Request) {
			res, err := p.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			for {
				_, err := res.Body.Read(buf)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			_ = res.Body.Close()
		}
		req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
		// exchange, header map (2), header values, head string
		const kept = 5
		if n := testing.AllocsPerRun(200, func() { exchange(req) }); n > kept {
			t.Errorf("%s: %v allocs per exchange, want at most %d", br.name, n, kept)
		}
		// A cancellable context: context.AfterFunc's watch (its context,
		// its stop function, the parent's child set and Done channel).
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		creq := req.WithContext(ctx)
		if n := testing.AllocsPerRun(200, func() { exchange(creq) }); n > kept+2 {
			t.Errorf("%s with a cancellable context: %v allocs per exchange, want at most %d", br.name, n, kept+2)
		}
	}
}
