// Package sizing measures what RateLimitly costs the network per
// protected request: datagrams and bytes for each request policy at 1, 3
// and 5 servers, healthy and with one server silent, through the real
// client (pkg/rlclient) and servers (pkg/rlserver) on loopback. The
// sizing model of docs/operations.md is built from its table
// (test/bench/sizing.sh).
package sizing

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit/rlcluster"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

// OutEnv names a file the table is written to (Markdown).
const OutEnv = "SIZING_TRAFFIC_OUT"

// checks per scenario, from workers goroutines at a time.
const (
	checks  = 400
	workers = 32
	unit    = 20 * time.Millisecond
)

// The request measured: what a typical protected location sends (a
// label, one guard, a per-client zone and a global zone), and its report.
func typicalRequest() *wire.RateRequest {
	return &wire.RateRequest{Label: []byte("api"),
		Guards: []wire.Guard{{Service: []byte("checkout:shop.example"), ThresholdMs: 250}},
		Resources: []wire.Resource{
			{Bucket: []byte("client:203.0.113.7"), Rate: 1 << 30, PeriodMs: 1000, Cost: 1},
			{Bucket: []byte("checkout"), Rate: 1 << 30, PeriodMs: 1000, Cost: 1},
		}}
}

var reportService = []byte("checkout:shop.example")

// ipUDP is the IPv4 and UDP header of every datagram on the wire.
const ipUDP = 20 + 8

// sizes are the on-wire bytes (IPv4) of each datagram kind for the
// typical request.
type sizes struct{ request, response, completion, report int }

func datagramSizes(t testing.TB) sizes {
	req := typicalRequest()
	resp := wire.RateResponse{Status: wire.StatusOK, Success: true,
		Guards: make([]wire.GuardResult, len(req.Guards)), Resources: make([]wire.ResourceResult, len(req.Resources))}
	rb, err := resp.AppendBody(nil)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := (&wire.Completion{Decision: wire.DecisionAllow, Request: *req}).AppendBody(nil)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := (&wire.LatencyReport{Entries: []wire.ReportEntry{{Service: reportService, DurationMs: 12}}}).AppendBody(nil)
	if err != nil {
		t.Fatal(err)
	}
	over := wire.HeaderLen + wire.TagLen + ipUDP
	return sizes{request: req.EncodedLen() + over, response: len(rb) + over, completion: len(cb) + over, report: len(pb) + over}
}

type scenario struct {
	policy ratelimitly.RequestPolicy
	nodes  int
	silent bool // node 0 (the oldest) drops every request
}

// perCheck is one scenario's measured traffic per protected request.
type perCheck struct {
	requests, replays, responses, completions, reports float64
	bytes                                              float64
	decided                                            float64 // share of checks with a valid decision
}

func policies() []ratelimitly.RequestPolicy {
	return []ratelimitly.RequestPolicy{
		ratelimitly.Standard(unit),
		ratelimitly.SingleRound(unit),
		{Name: ratelimitly.PolicyCustom, Unit: unit, ReplayGaps: []time.Duration{unit, unit}, Replays: 2, FinalReceive: unit, Completion: true},
	}
}

func run(t *testing.T, sc scenario, sz sizes) perCheck {
	cred := rlcluster.NewCredential(t, "sizing", 7)
	var silent atomic.Bool
	silent.Store(sc.silent)
	// Node i runs i ms ahead: distinct epochs, node 0 the oldest.
	start := time.Now()
	cl := rlcluster.Start(t, rlcluster.Config{Nodes: sc.nodes, Credentials: []credentials.Credential{cred},
		Node: func(i int, cfg *rlserver.Config) {
			off := time.Duration(i) * time.Millisecond
			cfg.Now = func() time.Time { return start.Add(time.Since(start) - off) }
			if i == 0 {
				cfg.Hooks = &rlserver.TestHooks{DropRequest: func(h *wire.Header) bool {
					return silent.Load() && h.Kind == wire.KindRateRequest
				}}
			}
		}})
	c, err := rlclient.New(rlclient.Config{SRV: cl.SRV, Resolver: cl.DNS.Addr(), ResolverTimeout: time.Second,
		Credential: cred, Policy: sc.policy, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testkit.WaitFor(t, "client sees every node", func() bool {
		st := c.Stats()
		return st.Ready && st.Endpoints == sc.nodes
	})
	before := make([]rlserver.Stats, sc.nodes)
	for i, s := range cl.Servers {
		before[i] = s.Stats()
	}
	cst0 := c.Stats()
	var next, valid atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := typicalRequest()
			var dec rlclient.Decision
			for next.Add(1) <= checks {
				if c.Check(context.Background(), req, &dec) == nil && dec.Cause == rlclient.CauseAllow {
					valid.Add(1)
					c.Report(reportService, 12*time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	// Completions and reports leave after the decision: wait until the
	// servers have every completion and report the client sent (the
	// silent node drops only requests; loopback loses nothing).
	var got perCheck
	testkit.WaitFor(t, "every completion and report arrived", func() bool {
		cst := c.Stats()
		var recv, resp, comps, reports uint64
		for i, s := range cl.Servers {
			st := s.Stats()
			recv += st.Received - before[i].Received
			resp += st.Responses - before[i].Responses
			comps += st.Completions - before[i].Completions
			reports += st.Reports - before[i].Reports
		}
		if comps != cst.Completions-cst0.Completions || reports != cst.Reports-cst0.Reports {
			return false
		}
		n := float64(checks)
		got = perCheck{
			requests:    float64(recv-comps-reports) / n, // first sends, replays and probes
			replays:     float64(cst.Replays-cst0.Replays) / n,
			responses:   float64(resp) / n,
			completions: float64(comps) / n,
			reports:     float64(reports) / n,
			decided:     float64(valid.Load()) / n,
		}
		return true
	})
	got.bytes = got.requests*float64(sz.request) + got.responses*float64(sz.response) +
		got.completions*float64(sz.completion) + got.reports*float64(sz.report)
	return got
}

// TestTraffic measures every scenario and checks what the request
// policies promise: no replay or completion under single_round, at most
// one replay round under standard, no completion to the server whose
// answer decided, and no more reports than allows times servers.
func TestTraffic(t *testing.T) {
	sz := datagramSizes(t)
	var b strings.Builder
	fmt.Fprintf(&b, "Datagram sizes on the wire (IPv4, typical request: label, 1 guard, 2 zones): request %d B, response %d B, completion %d B, report %d B.\n\n",
		sz.request, sz.response, sz.completion, sz.report)
	b.WriteString("| request policy | servers | case | requests sent (first sends, replays, probes) | of them replays | responses | completions | report datagrams | datagrams in all | bytes on the wire | decided |\n")
	b.WriteString("|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, pol := range policies() {
		for _, nodes := range []int{1, 3, 5} {
			for _, silent := range []bool{false, true} {
				if silent && nodes == 1 {
					continue
				}
				sc := scenario{policy: pol, nodes: nodes, silent: silent}
				name := fmt.Sprintf("%s/%d/silent=%v", pol.Name, nodes, silent)
				var m perCheck
				t.Run(name, func(t *testing.T) {
					m = run(t, sc, sz)
					switch {
					case pol.Name == ratelimitly.PolicySingleRound && (m.replays != 0 || m.completions != 0):
						t.Errorf("single_round sent %.2f replays and %.2f completions per check", m.replays, m.completions)
					case pol.Name == ratelimitly.PolicyStandard && m.replays > float64(nodes):
						t.Errorf("standard sent %.2f replays per check to %d servers (one round to the missing ones at most)", m.replays, nodes)
					case m.completions > float64(nodes-1):
						t.Errorf("%.2f completions per check to %d servers: never to the one whose answer decided", m.completions, nodes)
					case m.reports > m.decided*float64(nodes):
						t.Errorf("%.2f report datagrams per check for %.2f allows to %d servers", m.reports, m.decided, nodes)
					}
				})
				c := "all answer"
				if silent {
					c = "oldest silent"
				}
				fmt.Fprintf(&b, "| %s | %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f | %.3f |\n",
					pol.Name, nodes, c, m.requests, m.replays, m.responses, m.completions, m.reports,
					m.requests+m.responses+m.completions+m.reports, m.bytes, m.decided)
			}
		}
	}
	t.Log("\n" + b.String())
	if out := os.Getenv(OutEnv); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
