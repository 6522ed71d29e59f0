package exchange

import "bytes"

// Rejection rules of CheckPath.
const (
	RuleEscapedSlash           = "escaped-slash"
	RuleEscapedSlashDotSegment = "escaped-slash-dot-segment"
)

// CheckPath applies the service's rule on escaped slashes to a request's
// path (the target before '?'), for HTTP/1.x and HTTP/2 alike. It returns
// 0 and "" when the request proceeds, else the status (400) and the
// rejection rule.
//
// Locations match the decoded path (admission.NormalizePath turns %2F
// into a separator), as an upstream that decodes it sees it, while the
// upstream receives the target unchanged. An upstream that keeps %2F as
// data sees other segments than the match did, so by default a path with
// %2F or %5C (either case) is refused (RuleEscapedSlash), as Envoy's
// path_with_escaped_slashes_action: REJECT_REQUEST does. A service with
// DecodeEscapedSlashes lets it through, except when it also holds a "."
// or ".." segment (RuleEscapedSlashDotSegment): resolving dots across a
// decoded slash would move the match to another place than an upstream
// that does not decode would serve ("/public/a%2Fb/../../api/x" matches
// /public/api/x, such an upstream serves /api/x).
//
// It does not allocate.
func CheckPath(svc *Service, path []byte) (int, string) {
	if bytes.IndexByte(path, '%') < 0 {
		return 0, ""
	}
	escaped, dots := escapedSlashes(path)
	switch {
	case !escaped:
		return 0, ""
	case svc == nil || !svc.DecodeEscapedSlashes:
		return 400, RuleEscapedSlash
	case dots:
		return 400, RuleEscapedSlashDotSegment
	}
	return 0, ""
}

// escapedSlashes reports whether p holds an escaped slash or backslash
// (%2F, %5C in either case) and whether it holds a "." or ".." segment,
// with segments split at '/', '\', and their escapes, and %2E counted as
// a dot.
func escapedSlashes(p []byte) (escaped, dots bool) {
	onlyDots, ndot := true, 0 // the current segment's shape so far
	for i := 0; i <= len(p); i++ {
		sep := i == len(p) || p[i] == '/' || p[i] == '\\'
		if !sep && p[i] == '%' && i+2 < len(p) {
			hi, lo := p[i+1], lower(p[i+2])
			switch {
			case hi == '2' && lo == 'f', hi == '5' && lo == 'c':
				escaped, sep = true, true
				i += 2
			case hi == '2' && lo == 'e':
				ndot++
				i += 2
				continue
			}
		}
		switch {
		case sep:
			if onlyDots && (ndot == 1 || ndot == 2) {
				dots = true
			}
			onlyDots, ndot = true, 0
		case p[i] == '.':
			ndot++
		default:
			onlyDots = false
		}
	}
	return escaped, dots
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
