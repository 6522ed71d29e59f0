package rlserver

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the server's counters as Prometheus metrics
// (rlserver_*). Register it with a registry of your choice.
func (s *Server) Collector() prometheus.Collector { return &collector{s: s} }

type collector struct{ s *Server }

var (
	descReceived    = prometheus.NewDesc("rlserver_datagrams_received_total", "Datagrams read from the sockets.", nil, nil)
	descBatches     = prometheus.NewDesc("rlserver_read_batches_total", "Read turns (recvmmsg calls) that returned datagrams.", nil, nil)
	descReadErrors  = prometheus.NewDesc("rlserver_read_errors_total", "Failed read turns.", nil, nil)
	descDecisions   = prometheus.NewDesc("rlserver_decisions_total", "RATE_REQUESTs decided, by result (allow, deny, malformed).", []string{"result"}, nil)
	descReplays     = prometheus.NewDesc("rlserver_replays_total", "RATE_REQUESTs answered from the dedup cache.", nil, nil)
	descReports     = prometheus.NewDesc("rlserver_reports_total", "LATENCY_REPORT datagrams applied.", nil, nil)
	descCompletions = prometheus.NewDesc("rlserver_completions_total", "COMPLETION datagrams, by result (applied, ignored).", []string{"result"}, nil)
	descResponses   = prometheus.NewDesc("rlserver_responses_total", "RATE_RESPONSE datagrams sent.", nil, nil)
	descSendErrors  = prometheus.NewDesc("rlserver_send_errors_total", "Responses the kernel refused.", nil, nil)
	descSteered     = prometheus.NewDesc("rlserver_steering_feedback_total", "Responses that asked the client to move (steering_feedback = 0).", nil, nil)
	descDrops       = prometheus.NewDesc("rlserver_drops_total", "Datagrams dropped without an answer, by reason.", []string{"reason"}, nil)
	descKeys        = prometheus.NewDesc("rlserver_keys", "Live keys, by table (buckets, trackers, dedup).", []string{"table"}, nil)
	descCapacity    = prometheus.NewDesc("rlserver_capacity", "Keys a table holds at most, by table (buckets, trackers, dedup).", []string{"table"}, nil)
	descEvictions   = prometheus.NewDesc("rlserver_evictions_total", "Keys evicted because a table was full, by table.", []string{"table"}, nil)
	descEpoch       = prometheus.NewDesc("rlserver_epoch_seconds", "server_epoch: the server start time.", nil, nil)
	descWorkers     = prometheus.NewDesc("rlserver_workers", "Worker sockets.", nil, nil)
)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReceived, descBatches, descReadErrors, descDecisions, descReplays, descReports,
		descCompletions, descResponses, descSendErrors, descSteered, descDrops, descKeys, descCapacity, descEvictions, descEpoch, descWorkers} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	ctr := func(d *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
	}
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	ctr(descReceived, st.Received)
	ctr(descBatches, st.ReadBatches)
	ctr(descReadErrors, st.ReadErrors)
	ctr(descDecisions, st.Allows, "allow")
	ctr(descDecisions, st.Denies, "deny")
	ctr(descDecisions, st.Malformed, "malformed")
	ctr(descReplays, st.Replays)
	ctr(descReports, st.Reports)
	ctr(descCompletions, st.CompletionsApplied, "applied")
	ctr(descCompletions, st.CompletionsIgnored, "ignored")
	ctr(descResponses, st.Responses)
	ctr(descSendErrors, st.SendErrors)
	ctr(descSteered, st.Steered)
	for _, name := range dropNames {
		ctr(descDrops, st.Drops[name], name)
	}
	gauge(descKeys, float64(st.Buckets), "buckets")
	gauge(descKeys, float64(st.Trackers), "trackers")
	gauge(descKeys, float64(st.DedupEntries), "dedup")
	gauge(descCapacity, float64(st.BucketCapacity), "buckets")
	gauge(descCapacity, float64(st.TrackerCapacity), "trackers")
	gauge(descCapacity, float64(st.DedupCapacity), "dedup")
	ctr(descEvictions, st.BucketEvictions, "buckets")
	ctr(descEvictions, st.TrackerEvictions, "trackers")
	ctr(descEvictions, st.DedupEvictedLive, "dedup")
	gauge(descEpoch, float64(c.s.epoch)/1000)
	gauge(descWorkers, float64(st.Workers))
}
