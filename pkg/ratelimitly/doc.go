// Package ratelimitly is the RateLimitly protocol vocabulary shared by the
// client (pkg/rlclient), the server (pkg/rlserver) and the policy loader
// (pkg/admission): request policies with their horizon rules, and the one
// list of causes a check or an admission ends with. Its subpackages hold
// the wire v1 codec (wire) and the credentials file (credentials).
package ratelimitly
