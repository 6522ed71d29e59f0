// Package metrics defines every Prometheus metric rl-tproxy exports and serves
// them, with the health and readiness probes, on the admin listener.
//
// Hot-path code never looks series up by label values per request: it asks
// once (per policy generation) for the concrete counters of a service and
// location (Location) and increments those.
package metrics

import (
	"runtime"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Namespace prefixes every metric name.
const Namespace = "rl_tproxy"

// Outcomes lists every admission outcome label value, in the index order the
// hot path uses (see admission.Outcome). Kept here so that metrics does not
// import admission; admission's tests check the two lists agree.
var Outcomes = []string{
	"allow", "deny", "fail_open", "fail_close", "fail_local", "bypass",
	"shadow_deny", "internal_error", "client_abort", "guard_probe",
}

// AdmissionBuckets are the admission latency histogram buckets in seconds:
// the default request policy decides within 3 units of 20ms.
var AdmissionBuckets = []float64{0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.1, 0.25, 1}

// Metrics holds the registry and every metric of one process.
type Metrics struct {
	Registry *prometheus.Registry

	requests       *prometheus.CounterVec   // service, location, outcome
	causes         *prometheus.CounterVec   // cause
	admission      *prometheus.HistogramVec // service, location
	reports        *prometheus.CounterVec   // service (tracker service template owner)
	localFallback  *prometheus.CounterVec   // result
	localAllow     prometheus.Counter
	localDeny      prometheus.Counter
	upstreamErrors *prometheus.CounterVec // service
	denyAnswers    *prometheus.CounterVec // service, status
	denials        *prometheus.CounterVec // service, location, kind, name
	connections    *prometheus.CounterVec // service, protocol, action (conns.go)
	rejections     *prometheus.CounterVec // status, reason (rejections.go)
	rejectCounters sync.Map               // rejectKey -> prometheus.Counter

	reloads        *prometheus.CounterVec // result, trigger
	reloadErrors   prometheus.Counter
	generation     prometheus.Gauge
	lastReloadOK   prometheus.Gauge
	clientRebuilds prometheus.Counter
	inflight       prometheus.Gauge
	causeCounters  sync.Map // cause string -> prometheus.Counter
	srcMu          sync.Mutex
	src            *sources

	genMu        sync.Mutex
	gen, prevGen *genSeries // series of the generation being built and of the one before (prune.go)
}

// New creates the registry with the Go and process collectors, build
// information and every rl-tproxy metric.
func New(version, commit string) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{Registry: reg}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help:        "Build information; the value is always 1.",
		ConstLabels: prometheus.Labels{"version": version, "commit": commit, "goversion": runtime.Version()},
	})
	build.Set(1)
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "requests_total",
		Help: "HTTP requests that reached admission, by service, location and admission outcome.",
	}, []string{"service", "location", "outcome"})
	m.causes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "admission_causes_total",
		Help: "Admission results by cause (why the outcome happened: allow, deny_resource, timeout, ...).",
	}, []string{"cause"})
	m.admission = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "admission_duration_seconds",
		Help:    "Time spent obtaining an admission decision for protected requests.",
		Buckets: AdmissionBuckets,
	}, []string{"service", "location"})
	m.reports = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "latency_reports_total",
		Help: "Latency reports handed to the RateLimitly client (fire and forget), by service.",
	}, []string{"service"})
	m.localFallback = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "local_fallback_total",
		Help: "Decisions taken by the in-process token buckets under fail: local while RateLimitly was unusable, by result.",
	}, []string{"result"})
	m.upstreamErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "upstream_errors_total",
		Help: "Admitted requests whose upstream exchange failed, by service.",
	}, []string{"service"})
	m.denyAnswers = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "deny_responses_total",
		Help: "Deny answers written by the proxy, by service and HTTP status.",
	}, []string{"service", "status"})
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "policy_reloads_total",
		Help: "Policy reload attempts by result (success, error, unchanged) and trigger (signal, file).",
	}, []string{"result", "trigger"})
	m.reloadErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "policy_reload_errors_total",
		Help: "FILE:LINE errors reported by rejected policy reloads (one per error line).",
	})
	m.generation = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "policy_generation",
		Help: "Generation of the policy in force: 1 after start, +1 per successful reload.",
	})
	m.lastReloadOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "policy_last_reload_success_timestamp_seconds",
		Help: "Unix time of the last successful policy load or reload.",
	})
	m.clientRebuilds = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "ratelimitly_client_rebuilds_total",
		Help: "RateLimitly clients rebuilt because a reload changed discovery, credentials or request policy.",
	})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "admission_inflight",
		Help: "Admission decisions in progress (protected requests wait here for RateLimitly).",
	})
	reg.MustRegister(build, m.requests, m.causes, m.admission, m.reports, m.localFallback,
		m.upstreamErrors, m.denyAnswers, m.reloads, m.reloadErrors, m.generation, m.lastReloadOK,
		m.clientRebuilds, m.inflight)
	m.registerDenials()
	m.registerConnections()
	m.registerRejections()
	m.localAllow = m.localFallback.WithLabelValues("allow")
	m.localDeny = m.localFallback.WithLabelValues("deny")
	for _, r := range []string{"success", "error", "unchanged"} {
		for _, tr := range []string{"signal", "file"} {
			m.reloads.WithLabelValues(r, tr)
		}
	}
	return m
}

// Location is the set of per-request series of one (service, location) pair,
// resolved once so the hot path only increments.
type Location struct {
	Requests  []prometheus.Counter // indexed like Outcomes
	Admission prometheus.Observer
	Reports   prometheus.Counter
	Upstream  prometheus.Counter
	Deny      prometheus.Counter // deny answers of this service (status of the location)
}

// Location resolves the series of a service/location pair; denyStatus is
// the location's deny status. The series belong to the policy generation
// being built (Prune).
func (m *Metrics) Location(service, location, reportService string, denyStatus int) *Location {
	m.recordLocation(service, location, denyStatus)
	l := &Location{Requests: make([]prometheus.Counter, len(Outcomes))}
	for i, o := range Outcomes {
		l.Requests[i] = m.requests.WithLabelValues(service, location, o)
	}
	l.Admission = m.admission.WithLabelValues(service, location)
	l.Reports = m.reports.WithLabelValues(service)
	l.Upstream = m.upstreamErrors.WithLabelValues(service)
	l.Deny = m.denyAnswers.WithLabelValues(service, strconv.Itoa(denyStatus))
	return l
}

// Cause returns the counter of one cause string (cached; safe for the hot
// path after the first call per cause).
func (m *Metrics) Cause(cause string) prometheus.Counter {
	if c, ok := m.causeCounters.Load(cause); ok {
		return c.(prometheus.Counter)
	}
	c := m.causes.WithLabelValues(cause)
	m.causeCounters.Store(cause, c)
	return c
}

// LocalFallback counts one decision of the local token buckets.
func (m *Metrics) LocalFallback(allowed bool) {
	if allowed {
		m.localAllow.Inc()
		return
	}
	m.localDeny.Inc()
}

// Reload records a reload attempt: result is "success", "error" or
// "unchanged"; trigger "signal" or "file"; errs the number of error lines.
func (m *Metrics) Reload(result, trigger string, errs int) {
	m.reloads.WithLabelValues(result, trigger).Inc()
	if errs > 0 {
		m.reloadErrors.Add(float64(errs))
	}
}

// PolicyLoaded records a policy generation now in force at unix time ts.
func (m *Metrics) PolicyLoaded(generation uint64, ts float64) {
	m.generation.Set(float64(generation))
	m.lastReloadOK.Set(ts)
}

// ClientRebuilt counts a RateLimitly client rebuild.
func (m *Metrics) ClientRebuilt() { m.clientRebuilds.Inc() }

// Inflight is the gauge of admission checks in flight.
func (m *Metrics) Inflight() prometheus.Gauge { return m.inflight }
