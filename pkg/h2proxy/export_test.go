package h2proxy

// AdmitGoroutines is admitGoroutines for the external tests.
var AdmitGoroutines = &admitGoroutines
