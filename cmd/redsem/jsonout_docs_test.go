//go:build unix

package main

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every JSON document docs/cli.md describes has the keys the command
// writes, no more, no fewer: the ```json block or `{"a", "b"}` sketch after
// each marker against the json tags of the type behind it. A key written
// only when set (omitempty) may be absent from a block, but the page names
// it.
func TestJSONSchemaMatchesDocs(t *testing.T) {
	data, err := os.ReadFile("../../docs/cli.md")
	require.NoError(t, err)
	page := strings.Join(strings.Fields(string(data)), " ")
	for _, tc := range []struct {
		marker string
		doc    any
	}{
		{"(exit 0 also when NAME does not exist:", noneJSON{}},
		{"does not exist: `{\"kind\": \"none\", \"name\", \"exists\": false, \"kinds\": []}`), of a semaphore:", statusJSON{}},
		{"Of a read-write lock:", rwStatusJSON{}},
		{"Of a rate gate (also `redsem rate status --json NAME`):", rateStatusJSON{}},
		{"66 and no JSON when NAME does not exist), of a semaphore:", checkJSON{}},
		{"lacks). Of a lock:", rwCheckJSON{}},
		{"; of a rate gate:", rateCheckJSON{}},
		{"`redsem top --json` prints one document per refresh", fleetJSON{}},
		{"`redsem check --all --json` prints one report:", checkAllJSON{}},
	} {
		i := strings.Index(page, tc.marker)
		if !assert.GreaterOrEqual(t, i, 0, "docs/cli.md: no %q", tc.marker) {
			continue
		}
		rest := strings.TrimSpace(page[i+len(tc.marker):])
		all, optional := jsonKeys(reflect.TypeOf(tc.doc))
		if block, ok := strings.CutPrefix(rest, "```json "); ok {
			block, _, _ = strings.Cut(block, "```")
			var m map[string]json.RawMessage
			require.NoError(t, json.Unmarshal([]byte(block), &m), "docs/cli.md: the block after %q", tc.marker)
			var got []string
			for k := range m {
				got = append(got, k)
			}
			for _, k := range optional {
				if m[k] == nil {
					got = append(got, k)
					assert.True(t, strings.Contains(page, `"`+k+`"`), "docs/cli.md names %s, written only when set", k)
				}
			}
			sort.Strings(got)
			assert.Equal(t, all, got, "docs/cli.md: the block after %q", tc.marker)
			continue
		}
		assert.Equal(t, all, sketchKeys(rest[strings.Index(rest, "{"):]), "docs/cli.md: the sketch after %q", tc.marker)
	}
}

// jsonKeys are the keys a struct is written with, sorted, and those of
// them written only when set.
func jsonKeys(ty reflect.Type) (all, optional []string) {
	for i := 0; i < ty.NumField(); i++ {
		name, opts, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ",")
		all = append(all, name)
		if opts == "omitempty" {
			optional = append(optional, name)
		}
	}
	sort.Strings(all)
	return all, optional
}

var quoted = regexp.MustCompile(`^"([a-z_]+)"`)

// sketchKeys are the keys of a `{"a", "kind": "rate", "b" (a note), "c"
// ([{"n"}])}` sketch, sorted: the quoted names at its top level, leaving
// out values and what notes and nested lists or objects hold.
func sketchKeys(s string) []string {
	var out []string
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '{', '[', '(':
			depth++
		case '}', ']', ')':
			depth--
			if depth == 0 {
				sort.Strings(out)
				return out
			}
		case '"':
			m := quoted.FindStringSubmatch(s[i:])
			if m == nil {
				continue
			}
			if depth == 1 && !strings.HasSuffix(strings.TrimRight(s[:i], " "), ":") {
				out = append(out, m[1])
			}
			i += len(m[0]) - 1
		}
	}
	return nil
}
