package redsem_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAPITableCompiled: every call the tables of docs/api.md name
// (`Name(`, `Type.Name(`, `pkg.Name(` in a row's first cell) is called in
// that page's Go block, which TestDocs_compile builds: so each signature the
// page shows is one that compiles, not just one that reads well.
func TestAPITableCompiled(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("docs", "api.md"))
	require.NoError(t, err)
	var code strings.Builder
	for _, b := range goBlocks(t, filepath.Join(repoRoot(t), "docs", "api.md")) {
		code.WriteString(b.code)
	}
	require.NotEmpty(t, code.String(), "docs/api.md has no Go block")
	call := regexp.MustCompile(`([A-Za-z]+)\(`)
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cell := strings.SplitN(line, "|", 3)[1]
		for _, m := range call.FindAllStringSubmatch(cell, -1) {
			n++
			name := m[1]
			assert.Regexp(t, `(\.|\b)`+name+`\(`, code.String(), "docs/api.md: %s( in its table is not called in its Go block", name)
		}
	}
	assert.Greater(t, n, 40, "calls found in the tables")
}
