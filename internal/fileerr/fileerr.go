// Package fileerr is the FILE:LINE: message error shape shared by the
// policy and credentials loaders, which report every problem in a file.
package fileerr

import (
	"fmt"
	"strings"
)

// Error is one problem in a file, located by line.
type Error struct {
	File string
	Line int
	Msg  string
}

func (e Error) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg) }

// List is every problem found in a file (or a policy and the files it
// names), one FILE:LINE: message per line.
type List struct {
	Errs []Error
}

func (e *List) Error() string {
	parts := make([]string, len(e.Errs))
	for i, x := range e.Errs {
		parts[i] = x.Error()
	}
	return strings.Join(parts, "\n")
}
