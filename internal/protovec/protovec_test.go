package protovec

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// Dir is where the vectors live, relative to this package.
const dir = "../../docs/protocol-vectors"

func render(v Vector) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	return append(b, '\n'), err
}

// TestVectorsUpToDate: docs/protocol-vectors holds exactly what Generate
// produces (RL_WRITE_VECTORS=1 rewrites the files).
func TestVectorsUpToDate(t *testing.T) {
	gen := Generate()
	write := os.Getenv("RL_WRITE_VECTORS") == "1"
	for name, v := range gen {
		want, err := render(v)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if write {
			if err := os.WriteFile(p, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is stale or missing (%v): run RL_WRITE_VECTORS=1 go test ./internal/protovec", p, err)
		}
	}
	vs, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != len(gen) {
		t.Errorf("%d vector files, want %d (remove stale ones)", len(vs), len(gen))
	}
}
