package exporter

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Grafana dashboard in docs/ queries only metrics the Collector
// exports, with balanced brackets, and every metric is on it somewhere.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("../docs/grafana-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(raw, &dash))

	exported := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, d := range allDescs {
		m := fq.FindStringSubmatch(d.String())
		require.NotNil(t, m, d.String())
		exported[m[1]] = true
	}
	used := map[string]bool{}
	metric := regexp.MustCompile(`\bredsem_[a-z_]+`)
	exprs := 0
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			exprs++
			for _, name := range metric.FindAllString(tg.Expr, -1) {
				assert.True(t, exported[name], "panel %q queries %s, which the exporter does not export", p.Title, name)
				used[name] = true
			}
			for _, pair := range []string{"()", "{}", "[]"} {
				assert.Equal(t, strings.Count(tg.Expr, pair[:1]), strings.Count(tg.Expr, pair[1:]),
					"panel %q: unbalanced %s in %s", p.Title, pair, tg.Expr)
			}
		}
	}
	assert.Greater(t, exprs, 10)
	for name := range exported {
		assert.True(t, used[name], "%s is on no panel", name)
	}
}
