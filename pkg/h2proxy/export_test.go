package h2proxy

// AdmitGoroutines is admitGoroutines for the external tests.
var AdmitGoroutines = &admitGoroutines

// UpstreamSweep is upstreamSweep for the external tests.
var UpstreamSweep = &upstreamSweep

// UpstreamAddrs lists the upstream addresses s holds transports for.
func UpstreamAddrs(s *Server) []string {
	s.ups.mu.Lock()
	defer s.ups.mu.Unlock()
	var addrs []string
	for k := range s.ups.m {
		addrs = append(addrs, k.addr)
	}
	return addrs
}
