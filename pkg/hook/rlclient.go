package hook

import (
	"context"
	"sync"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/metrics"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
)

// Client adapts an *rlclient.Client to admission.Checker.
type Client struct {
	C    *rlclient.Client
	pool sync.Pool
}

// NewClient wraps c.
func NewClient(c *rlclient.Client) *Client {
	a := &Client{C: c}
	a.pool.New = func() any { return new(rlclient.Decision) }
	return a
}

// Check implements admission.Checker. The client has already chosen a
// valid answer (status OK, exact cardinality); its Allow is the answer's
// success, and the guard and resource results are handed on so that the
// admission engine re-applies the whole allow contract.
func (a *Client) Check(ctx context.Context, req *wire.RateRequest, out *admission.CheckResult) {
	d := a.pool.Get().(*rlclient.Decision)
	d.Reset()
	err := a.C.Check(ctx, req, d)
	fillResult(d, err, out)
	a.pool.Put(d)
}

// fillResult hands the client's outcome to the admission engine.
func fillResult(d *rlclient.Decision, err error, out *admission.CheckResult) {
	out.Resp.Guards, out.Resp.Resources = out.Resp.Guards[:0], out.Resp.Resources[:0]
	if err == nil && d.Cause.Decided() {
		out.Valid, out.Fail = true, ratelimitly.CauseAllow
		out.Resp.Status, out.Resp.Success, out.Resp.ServerEpoch = wire.StatusOK, d.Allow, d.ServerEpoch
		out.Resp.Guards = append(out.Resp.Guards, d.Guards...)
		out.Resp.Resources = append(out.Resp.Resources, d.Resources...)
	} else {
		out.Valid, out.Fail = false, d.Cause // one vocabulary: no translation
	}
}

// Report implements admission.Checker.
func (a *Client) Report(service []byte, d time.Duration) { a.C.Report(service, d) }

// Close closes the client.
func (a *Client) Close() error { return a.C.Close() }

// Stats adapts the client's counters for the metrics package.
func (a *Client) Stats() metrics.ClientStats {
	s := a.C.Stats()
	byCause := map[string]uint64{}
	for _, c := range rlclient.CheckCauses {
		byCause[c.String()] = s.Causes[c]
	}
	per := make([]metrics.EndpointStats, len(s.PerEndpoint))
	for i, e := range s.PerEndpoint {
		per[i] = metrics.EndpointStats{Target: e.Target, Addr: e.Addr.String(), Usable: e.Usable, Chosen: e.Chosen}
	}
	return metrics.ClientStats{
		PerEndpoint: per,
		Ready:       s.Ready,
		Endpoints:   s.Endpoints,
		Sent:        s.Ring.Sent,
		Received:    s.Ring.Received,
		Dropped: map[string]uint64{
			"malformed": s.Drops.Malformed, "kind": s.Drops.Kind, "unknown_id": s.Drops.UnknownID,
			"auth": s.Drops.Auth, "stale": s.Drops.Stale, "body": s.Drops.Body, "echo": s.Drops.Echo,
			"unknown_source": s.Drops.UnknownSource, "duplicate": s.Drops.Duplicate,
		},
		Batches:        s.Ring.SendBatches,
		Rebinds:        s.Ring.Rebinds,
		Reports:        s.Reports,
		Completions:    s.Completions,
		Replays:        s.Replays,
		ByCause:        byCause,
		ResolveErrors:  s.LookupFailures,
		ReportsDropped: s.ReportsDropped,
		Usable:         s.Usable,
		Probes:         s.Probes,
		DecidedEarly:   s.DecidedEarly,
		DecidedAtUnit:  s.DecidedAtUnit,
	}
}
