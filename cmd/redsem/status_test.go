//go:build unix

package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatusJSONAndTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, helperEnvFor(), append([]string{"run", "--size", "3", "--label", "nightly job", "st"}, helperArgs()...)...)
	waitHelper(t, e.dir, "child")
	info := helperInfo(e.dir, "child") // mode pid fence slot token
	require.Len(t, info, 5)
	fence, err := strconv.ParseInt(info[2], 10, 64)
	require.NoError(t, err)

	r := e.run(t, "status", "--json", "st")
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	assert.True(t, st.Exists)
	assert.Equal(t, "st", st.Name)
	assert.Equal(t, 3, st.Size)
	assert.Equal(t, 2, st.Available)
	assert.Equal(t, 1, st.Held)
	require.Len(t, st.Holders, 1)
	h := st.Holders[0]
	assert.Equal(t, fence, h.Fence, "status shows the fence the command saw in REDSEM_FENCE")
	assert.Equal(t, info[3], h.Slot)
	assert.Equal(t, info[4], h.Token)
	assert.Equal(t, "nightly job", h.Label)
	assert.False(t, h.Expired)
	assert.Greater(t, h.TTLLeftMs, int64(0))

	r = e.run(t, "status", "st")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "available  2")
	assert.Contains(t, r.stdout, "SLOT")
	assert.Contains(t, r.stdout, info[2])

	r = e.run(t, "status", "--json", "nobody")
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	assert.False(t, st.Exists)
	assert.Empty(t, st.Holders)

	r = e.run(t, "reclaim", "st")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "reclaimed 0")

	r = e.run(t, "delete", "st")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, "--force")
	assert.Contains(t, r.stderr, "1 holder(s)")
	assert.Equal(t, 1, strings.Count(r.stderr, "\n"))
}
