package redsem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
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
	t.Parallel()
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

// TestAPITableListsEveryAdminCall: every exported function of package
// admin and every method of its Handle is named in a table of docs/api.md
// (the reverse of TestAPITableCompiled), so the page's "every call" holds.
func TestAPITableListsEveryAdminCall(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("docs", "api.md"))
	require.NoError(t, err)
	var cells strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "| `") {
			cells.WriteString(strings.SplitN(line, "|", 3)[1])
		}
	}
	pkgs, err := parser.ParseDir(token.NewFileSet(), "admin", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	require.NoError(t, err)
	n := 0
	for _, f := range pkgs["admin"].Files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || !fn.Name.IsExported() {
				continue
			}
			if fn.Recv != nil {
				star, ok := fn.Recv.List[0].Type.(*ast.StarExpr)
				if !ok || star.X.(*ast.Ident).Name != "Handle" {
					continue // a method of a value type (Status.Expired...)
				}
			}
			n++
			named := regexp.MustCompile(`(\.|\b)` + fn.Name.Name + `\(`).MatchString(cells.String())
			assert.True(t, named, "admin.%s is missing from docs/api.md's tables", fn.Name.Name)
		}
	}
	assert.Greater(t, n, 10, "admin calls found")
}
