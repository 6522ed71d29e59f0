package redirect

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rl-tproxy/rl-tproxy/internal/netnstest"
)

// BenchmarkNewConnections measures new TCP connections per second from a
// client namespace over a veth pair: connect, wait for the server's close,
// close. "steered" dials the service port 80 and sk_lookup hands the SYN to
// the proxy's listener; "direct" dials that same listener on its own port
// (the program still runs and passes); "no_program" dials the listener with
// nothing attached.
//
//	go test -run '^$' -bench BenchmarkNewConnections -benchtime 20000x ./pkg/redirect/
func BenchmarkNewConnections(b *testing.B) {
	for _, mode := range []string{"no_program", "direct", "steered"} {
		b.Run(mode, func(b *testing.B) {
			requireBPF(b)
			p := netnstest.NewPair(b)
			// Server-side close first keeps TIME_WAIT off the client's ports.
			var ln net.Listener
			if err := p.Node.Do(func() (err error) {
				var lc net.ListenConfig
				lc.SetMultipathTCP(false)
				ln, err = lc.Listen(b.Context(), "tcp4", "0.0.0.0:9000")
				return err
			}); err != nil {
				b.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
			b.Cleanup(func() { ln.Close(); <-done })

			target := netip.AddrPortFrom(p.NodeIP4, 9000).String()
			if mode != "no_program" {
				var r *Redirect
				root := netnstest.BPFFS(b) + "/rl-tproxy"
				if err := p.Node.Do(func() (err error) {
					r, err = Attach(Config{PinRoot: root, Ports: []uint16{80}})
					return err
				}); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { r.Close() })
				if err := r.RegisterListener(ln); err != nil {
					b.Fatal(err)
				}
				if mode == "steered" {
					target = netip.AddrPortFrom(p.NodeIP4, 80).String()
				}
			}
			err := p.Client.Do(func() error {
				var buf [1]byte
				b.ResetTimer()
				for b.Loop() {
					c, err := net.Dial("tcp4", target)
					if err != nil {
						return err
					}
					if _, err := c.Read(buf[:]); err != io.EOF {
						c.Close()
						return err
					}
					c.Close()
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "conns/s")
		})
	}
}

// BenchmarkProgramRun measures the program alone with PROG_TEST_RUN (the
// kernel repeats it 1000 times per op): the cost sk_lookup adds to a SYN.
//
//	go test -run '^$' -bench BenchmarkProgramRun ./pkg/redirect/
func BenchmarkProgramRun(b *testing.B) {
	requireBPF(b)
	ns := netnstest.New(b)
	var r *Redirect
	root := netnstest.BPFFS(b) + "/rl-tproxy"
	if err := ns.Do(func() (err error) {
		r, err = Attach(Config{PinRoot: root, Ports: []uint16{80}})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		ln, err = lc.Listen(b.Context(), "tcp4", "127.0.0.1:0")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	if err := r.RegisterListener(ln); err != nil {
		b.Fatal(err)
	}
	ap := netip.MustParseAddrPort
	for _, bc := range []struct {
		name string
		ctx  skLookupCtx
	}{
		{"steered", lookupCtx(6, ap("10.9.0.2:40000"), ap("10.9.0.1:80"))},
		{"not_matched", lookupCtx(6, ap("10.9.0.2:40000"), ap("10.9.0.1:81"))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			const repeat = 1000
			var out skLookupCtx
			for b.Loop() {
				if _, err := r.prog.Run(&ebpf.RunOptions{Context: bc.ctx, ContextOut: &out, Repeat: repeat}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*repeat), "ns/lookup")
		})
	}
}

// BenchmarkNewConnectionsPaired alternates one steered and one direct
// connection (same listener, same client) per op and times each, so both
// see the same load on a shared machine; it reports their rates and ratio.
//
//	go test -run '^$' -bench BenchmarkNewConnectionsPaired -benchtime 20000x ./pkg/redirect/
func BenchmarkNewConnectionsPaired(b *testing.B) {
	requireBPF(b)
	p := netnstest.NewPair(b)
	var ln net.Listener
	if err := p.Node.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		ln, err = lc.Listen(b.Context(), "tcp4", "0.0.0.0:9000")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	b.Cleanup(func() { ln.Close(); <-done })
	var r *Redirect
	root := netnstest.BPFFS(b) + "/rl-tproxy"
	if err := p.Node.Do(func() (err error) {
		r, err = Attach(Config{PinRoot: root, Ports: []uint16{80}})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	if err := r.RegisterListener(ln); err != nil {
		b.Fatal(err)
	}
	steered := netip.AddrPortFrom(p.NodeIP4, 80).String()
	direct := netip.AddrPortFrom(p.NodeIP4, 9000).String()
	var dSteered, dDirect time.Duration
	err := p.Client.Do(func() error {
		var buf [1]byte
		one := func(target string) (time.Duration, error) {
			start := time.Now()
			c, err := net.Dial("tcp4", target)
			if err != nil {
				return 0, err
			}
			if _, err := c.Read(buf[:]); err != io.EOF {
				c.Close()
				return 0, err
			}
			c.Close()
			return time.Since(start), nil
		}
		for i := 0; b.Loop(); i++ {
			// Alternate which goes first to cancel ordering effects.
			order := [2]string{steered, direct}
			if i%2 == 1 {
				order = [2]string{direct, steered}
			}
			for _, target := range order {
				d, err := one(target)
				if err != nil {
					return err
				}
				if target == steered {
					dSteered += d
				} else {
					dDirect += d
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	c, err := r.Counters()
	if err != nil {
		b.Fatal(err)
	}
	if c.Steered < uint64(b.N) {
		b.Fatalf("only %d of %d connections were steered", c.Steered, b.N)
	}
	b.ReportMetric(float64(b.N)/dSteered.Seconds(), "steered-conns/s")
	b.ReportMetric(float64(b.N)/dDirect.Seconds(), "direct-conns/s")
	b.ReportMetric(dDirect.Seconds()/dSteered.Seconds(), "steered/direct-rate")
}
