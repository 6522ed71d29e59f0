package metrics

import (
	"fmt"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// ClientStats is what the RateLimitly client reports at scrape time; the
// command adapts rlclient.Stats to it so that metrics stays a leaf.
type ClientStats struct {
	Ready         bool
	Endpoints     int
	Sent          uint64
	Received      uint64
	Dropped       map[string]uint64 // by reason
	Batches       uint64
	Rebinds       uint64
	Reports       uint64
	Completions   uint64
	Replays       uint64
	ByCause       map[string]uint64 // check results by client cause
	ResolveErrors uint64
	// ReportsDropped counts latency reports not sent (no endpoints, an
	// invalid service, a full send queue).
	ReportsDropped uint64
	Usable         int    // endpoints in the usable set
	Probes         uint64 // probes sent to unusable endpoints
	DecidedEarly   uint64 // checks decided on an answer
	DecidedAtUnit  uint64 // checks decided at a round deadline
	PerEndpoint    []EndpointStats
}

// EndpointStats is one RateLimitly endpoint (an address of an SRV target).
type EndpointStats struct {
	Target, Addr string
	Usable       bool
	Chosen       uint64 // decisions taken with its answer
}

// ServerStats is what an embedded RateLimitly server reports.
type ServerStats struct {
	Requests, Allows, Denies, Reports, Completions uint64
	Dropped                                        map[string]uint64
}

// ProxyStats is what the data path reports at scrape time.
type ProxyStats struct {
	OpenConnections int64
	UpstreamIdle    int64 // idle pooled upstream connections
	// The event loops (0 before they start): loop turns, waits parked in
	// Go's netpoller and waits inside the system call, buffers held by
	// connections, receives that found no provided buffer.
	EventLoops                 int
	LoopTurns                  uint64
	LoopParks, LoopKernelWaits uint64
	LoopBuffers                int64
	LoopStarved                uint64
	LoopSpliced                uint64 // body bytes spliced (kernel to kernel)
	// Lookups of upstream host names, and those that failed.
	UpstreamLookups, UpstreamLookupErrors uint64
}

// statsCollector is a collector computed from a callback at scrape time.
type statsCollector struct {
	mu    sync.Mutex
	descs []*prometheus.Desc
	fn    func(ch chan<- prometheus.Metric)
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	fn := c.fn
	c.mu.Unlock()
	if fn != nil {
		fn(ch)
	}
}

func (c *statsCollector) set(fn func(ch chan<- prometheus.Metric)) {
	c.mu.Lock()
	c.fn = fn
	c.mu.Unlock()
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, labels, nil)
}

var (
	descClientReady     = desc("ratelimitly_discovery_ready", "1 once RateLimitly SRV discovery has succeeded at least once.")
	descClientEndpoints = desc("ratelimitly_endpoints", "RateLimitly endpoints currently discovered.")
	descClientSent      = desc("ratelimitly_datagrams_sent_total", "Datagrams sent to RateLimitly (requests, replays, completions, reports).")
	descClientRecv      = desc("ratelimitly_datagrams_received_total", "Datagrams received from RateLimitly.")
	descClientDropped   = desc("ratelimitly_datagrams_dropped_total", "Received datagrams dropped by the client, by reason.", "reason")
	descClientBatches   = desc("ratelimitly_batches_total", "Batched socket sends performed by the client.")
	descClientRebinds   = desc("ratelimitly_rebinds_total", "Source-port rebinds performed on steering feedback.")
	descClientReports   = desc("ratelimitly_reports_sent_total", "Latency report datagrams sent by the client.")
	descClientCompl     = desc("ratelimitly_completions_sent_total", "Completion datagrams sent by the client.")
	descClientReplays   = desc("ratelimitly_replays_total", "Replay rounds sent by the client.")
	descClientCauses    = desc("ratelimitly_checks_total", "Checks finished by the client, by client cause.", "cause")
	descClientResolve   = desc("ratelimitly_resolve_errors_total", "Failed SRV discovery attempts.")
	descReportsDropped  = desc("reports_dropped_total", "Latency reports not sent (no RateLimitly endpoint, invalid service, full send queue).")
	descClientUsable    = desc("ratelimitly_usable_endpoints", "RateLimitly endpoints in the usable set (answered one of their last requests).")
	descClientProbes    = desc("ratelimitly_probes_total", "Probes sent to RateLimitly endpoints outside the usable set.")
	descEndpointUsable  = desc("ratelimitly_endpoint_usable", "1 when the endpoint is in the usable set.", "target", "addr")
	descEndpointChosen  = desc("ratelimitly_endpoint_decisions_total", "Checks decided with this endpoint's answer (the oldest valid one).", "target", "addr")
	descClientDecided   = desc("ratelimitly_checks_decided_total", "Checks decided, by when: early (on an answer) or deadline (at a round end, after waiting for a missing endpoint).", "when")

	descSrvRequests = desc("embedded_server_requests_total", "Rate requests handled by the embedded RateLimitly server.")
	descSrvAllows   = desc("embedded_server_allows_total", "Allows answered by the embedded RateLimitly server.")
	descSrvDenies   = desc("embedded_server_denies_total", "Denies answered by the embedded RateLimitly server.")
	descSrvReports  = desc("embedded_server_reports_total", "Latency reports received by the embedded RateLimitly server.")
	descSrvCompl    = desc("embedded_server_completions_total", "Completions received by the embedded RateLimitly server.")
	descSrvDropped  = desc("embedded_server_dropped_total", "Datagrams dropped by the embedded RateLimitly server, by reason.", "reason")

	descOpenConns    = desc("open_connections", "Client connections currently open on the proxy.")
	descUpstreamIdle = desc("upstream_idle_connections", "Idle pooled keep-alive connections to upstreams.")
	descLoops        = desc("event_loops", "Event loops serving the HTTP/1.1 data path.")
	descLoopTurns    = desc("event_loop_turns_total", "Event loop turns (one wait for events and the work it found).")
	descLoopWaits    = desc("event_loop_waits_total", "Event loop waits for events, by how: parked in Go's netpoller (netpoller) or inside the system call holding the loop's P (kernel).", "how")
	descLoopBuffers  = desc("event_loop_buffers", "Receive and write buffers held by connections (0 when every connection is idle).")
	descLoopStarved  = desc("event_loop_starved_total", "io_uring receives that found the provided-buffer ring empty and waited for buffers.")
	descLoopSpliced  = desc("event_loop_spliced_bytes_total", "Request and response body bytes moved between client and upstream sockets by splice(2), without a copy through the proxy.")
	descLookups      = desc("upstream_lookups_total", "Lookups of upstream host names by the event loops, by result: ok, or failed (an error or no usable address).", "result")
)

// Sources are the scrape-time collectors; set their callbacks with the
// SetXxx methods once the component exists. A nil callback exports nothing.
type sources struct {
	client, server, proxy *statsCollector
}

func (m *Metrics) sources() *sources {
	m.srcMu.Lock()
	defer m.srcMu.Unlock()
	if m.src == nil {
		m.src = &sources{
			client: &statsCollector{descs: []*prometheus.Desc{descClientReady, descClientEndpoints, descClientSent, descClientRecv,
				descClientDropped, descClientBatches, descClientRebinds, descClientReports, descClientCompl, descClientReplays,
				descClientCauses, descClientResolve, descReportsDropped, descClientUsable, descClientProbes, descClientDecided,
				descEndpointUsable, descEndpointChosen}},
			server: &statsCollector{descs: []*prometheus.Desc{descSrvRequests, descSrvAllows, descSrvDenies, descSrvReports, descSrvCompl, descSrvDropped}},
			proxy: &statsCollector{descs: []*prometheus.Desc{descOpenConns, descUpstreamIdle,
				descLoops, descLoopTurns, descLoopWaits, descLoopBuffers, descLoopStarved, descLoopSpliced, descLookups}},
		}
		m.Registry.MustRegister(m.src.client, m.src.server, m.src.proxy)
	}
	return m.src
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, lv ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, lv ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
}

func sortedKeys(m map[string]uint64) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// SetClientStats exports the RateLimitly client's counters from fn (called
// at scrape time). fn may be swapped when the client is rebuilt.
func (m *Metrics) SetClientStats(fn func() ClientStats) {
	if fn == nil {
		m.sources().client.set(nil)
		return
	}
	m.sources().client.set(func(ch chan<- prometheus.Metric) {
		s := fn()
		ready := 0.0
		if s.Ready {
			ready = 1
		}
		gauge(ch, descClientReady, ready)
		gauge(ch, descClientEndpoints, float64(s.Endpoints))
		counter(ch, descClientSent, s.Sent)
		counter(ch, descClientRecv, s.Received)
		for _, k := range sortedKeys(s.Dropped) {
			counter(ch, descClientDropped, s.Dropped[k], k)
		}
		counter(ch, descClientBatches, s.Batches)
		counter(ch, descClientRebinds, s.Rebinds)
		counter(ch, descClientReports, s.Reports)
		counter(ch, descClientCompl, s.Completions)
		counter(ch, descClientReplays, s.Replays)
		for _, k := range sortedKeys(s.ByCause) {
			counter(ch, descClientCauses, s.ByCause[k], k)
		}
		counter(ch, descClientResolve, s.ResolveErrors)
		counter(ch, descReportsDropped, s.ReportsDropped)
		gauge(ch, descClientUsable, float64(s.Usable))
		counter(ch, descClientProbes, s.Probes)
		counter(ch, descClientDecided, s.DecidedEarly, "early")
		counter(ch, descClientDecided, s.DecidedAtUnit, "deadline")
		for _, e := range s.PerEndpoint {
			usable := 0.0
			if e.Usable {
				usable = 1
			}
			gauge(ch, descEndpointUsable, usable, e.Target, e.Addr)
			counter(ch, descEndpointChosen, e.Chosen, e.Target, e.Addr)
		}
	})
}

// SetServerStats exports an embedded RateLimitly server's counters.
func (m *Metrics) SetServerStats(fn func() ServerStats) {
	if fn == nil {
		m.sources().server.set(nil)
		return
	}
	m.sources().server.set(func(ch chan<- prometheus.Metric) {
		s := fn()
		counter(ch, descSrvRequests, s.Requests)
		counter(ch, descSrvAllows, s.Allows)
		counter(ch, descSrvDenies, s.Denies)
		counter(ch, descSrvReports, s.Reports)
		counter(ch, descSrvCompl, s.Completions)
		for _, k := range sortedKeys(s.Dropped) {
			counter(ch, descSrvDropped, s.Dropped[k], k)
		}
	})
}

// SetProxyStats exports the data path's gauges and counters.
func (m *Metrics) SetProxyStats(fn func() ProxyStats) {
	if fn == nil {
		m.sources().proxy.set(nil)
		return
	}
	m.sources().proxy.set(func(ch chan<- prometheus.Metric) {
		s := fn()
		gauge(ch, descOpenConns, float64(s.OpenConnections))
		gauge(ch, descUpstreamIdle, float64(s.UpstreamIdle))
		gauge(ch, descLoops, float64(s.EventLoops))
		counter(ch, descLoopTurns, s.LoopTurns)
		counter(ch, descLoopWaits, s.LoopParks, "netpoller")
		counter(ch, descLoopWaits, s.LoopKernelWaits, "kernel")
		gauge(ch, descLoopBuffers, float64(s.LoopBuffers))
		counter(ch, descLoopStarved, s.LoopStarved)
		counter(ch, descLoopSpliced, s.LoopSpliced)
		counter(ch, descLookups, s.UpstreamLookups-s.UpstreamLookupErrors, "ok")
		counter(ch, descLookups, s.UpstreamLookupErrors, "failed")
	})
}

// String names the metric set (for debugging).
func (m *Metrics) String() string { return fmt.Sprintf("metrics(%s)", Namespace) }
