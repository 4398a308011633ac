package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every script Go declares lists its keys on a "-- KEYS:" header line, and
// Go passes exactly as many keys as that line names: a key added to a
// script or to its declaration without the other fails here, instead of
// shifting every argument by one at run time. Every file in lua/ is either
// an entry script or a helper that entry scripts run after, never both.
func TestScriptHeadersMatchDeclarations(t *testing.T) {
	decls := declarations()
	entries, helpers := map[string]bool{}, map[string]bool{}
	for _, d := range decls {
		entries[d.File] = true
		for _, h := range d.Helpers {
			helpers[h] = true
		}
	}
	for _, f := range []string{"acquire.lua", "release.lua", "refresh.lua", "abort.lua", "acquire_n.lua",
		"abort_n.lua", "resize.lua", "repair.lua", "check.lua", "status.lua", "rate_take.lua", "rate_abort.lua",
		"rate_set.lua", "rate_status.lua"} {
		assert.True(t, entries[f], "%s is not declared: is the registry still complete?", f)
	}
	assert.Empty(t, headerMismatches(decls))

	files, err := filepath.Glob("lua/*.lua")
	require.NoError(t, err)
	for _, f := range files {
		f = filepath.Base(f)
		assert.True(t, entries[f] != helpers[f], "%s: entry %v, helper %v: it must be exactly one", f, entries[f], helpers[f])
	}

	for _, d := range decls {
		assert.GreaterOrEqual(t, d.MinArgs, 0, "%s: its \"-- ARGV:\" header cannot be read", d.File)
	}

	// The check fails for a declaration that passes one key too few.
	wrong := append(decls, Declaration{File: "acquire.lua", Keys: 5})
	assert.Len(t, headerMismatches(wrong), 1)
}

// headerMismatches lists the declarations whose key count differs from
// their script's header.
func headerMismatches(decls []Declaration) []string {
	var out []string
	for _, d := range decls {
		names, err := headerKeys(d.File)
		switch {
		case err != nil:
			out = append(out, err.Error())
		case len(names) != d.Keys:
			out = append(out, fmt.Sprintf("%s: Go passes %d keys, its header lists %d: %v", d.File, d.Keys, len(names), names))
		}
	}
	return out
}

// The reply codes codes.lua names are the ones Go names.
func TestReplyCodesMatch(t *testing.T) {
	want := map[string]int64{"WAITING": CodeWaiting, "GRANTED": CodeGranted,
		"SETTLED": CodeSettled, "RELEASED": CodeReleased}
	got := map[string]int64{}
	for _, line := range strings.Split(part("codes.lua"), "\n") {
		var name string
		var v int64
		if n, _ := fmt.Sscanf(line, "local %s = %d", &name, &v); n == 2 {
			got[name] = v
		}
	}
	assert.Equal(t, want, got)
}

// A call whose argument count differs from the script's "-- ARGV:" header
// is refused before anything is sent (ErrArity); every call the
// suite makes passes through the same check, so a header and its call
// site cannot drift apart unnoticed.
func TestScriptCallsMatchArgvHeaders(t *testing.T) {
	ctx := context.Background()
	args := []interface{}{"m", "t", "l", "h", "w", "p", 2, NewAcqID(), 1000, "", 0, 100, 100, "fresh"}
	for _, bad := range [][]interface{}{args[:len(args)-1], append(args, "fixed", 0, "extra")} {
		_, err := RunScript(ctx, nil, Acquire, bad...) // a nil conn: nothing may be sent
		require.ErrorIs(t, err, ErrArity)
	}
	lo, hi, err := headerArgs("acquire.lua")
	require.NoError(t, err)
	assert.Equal(t, [2]int{8, 10}, [2]int{lo, hi}, "acquire.lua: 8 arguments, and optionally the size mode and the idle time")
	lo, hi, err = headerArgs("resize.lua")
	require.NoError(t, err)
	assert.Equal(t, [2]int{2, 3}, [2]int{lo, hi}, "resize.lua: n, seed, and optionally idleMs")
	lo, hi, err = headerArgs("release.lua")
	require.NoError(t, err)
	assert.Equal(t, [2]int{2, Variadic}, [2]int{lo, hi}, "release.lua: token, acqID, then more tokens")
	lo, hi, err = headerArgs("status.lua")
	require.NoError(t, err)
	assert.Equal(t, [2]int{0, 0}, [2]int{lo, hi})
	_, _, err = headerArgs("base.lua")
	assert.Error(t, err, "a helper has no ARGV header")
}

// Every call names its arguments as the script's "-- ARGV:" header does
// (Args): a call that names one differently, shifts one, leaves a
// required one out or adds one is refused before anything is sent, and the
// names the calls give are the header's.
func TestScriptCallsNameTheirArguments(t *testing.T) {
	ctx := context.Background()
	h, err := argHeader("acquire_n.lua", part("acquire_n.lua"))
	require.NoError(t, err)
	assert.Equal(t, []string{"size", "acqID", "k", "ttlMs", "label", "blockMs", "graceMs", "tombMs", "pollMs",
		"phase", "sizeMode", "idleMs"}, h.Names)
	assert.Equal(t, 12, h.Required)
	h, err = argHeader("refresh.lua", part("refresh.lua"))
	require.NoError(t, err)
	assert.Equal(t, ArgHeader{Names: []string{"token", "acqID", "ttlMs"}, Required: 3, Rest: true}, h)
	h, err = argHeader("acquire.lua", part("acquire.lua"))
	require.NoError(t, err)
	assert.Equal(t, 8, h.Required)
	assert.Equal(t, []string{"sizeMode", "idleMs"}, h.Names[8:])

	keys := []interface{}{"{n}:meta", "{n}:tokens", "{n}:leases", "{n}:holders", "{n}:waits"}
	pend := func(acq string) string { return "{n}:pend:" + acq }
	good := []Arg{A("limit", 10)}
	require.Equal(t, append(keys, 10), Args(Reclaim, keys, good...))
	for name, bad := range map[string][]Arg{
		"renamed":  {A("max", 10)},
		"extra":    {A("limit", 10), A("limit", 10)},
		"left out": {},
		"rest":     {A("limit", 10), Rest("x")},
	} {
		_, err := RunScript(ctx, nil, Reclaim, Args(Reclaim, keys, bad...)...) // a nil conn: nothing may be sent
		require.ErrorIs(t, err, ErrArity, name)
	}
	// A list of values goes last.
	rel := keys[:4]
	_, err = RunScript(ctx, nil, Release, Args(Release, rel,
		A("token", "e:1"), Rest("e:2"), A("acqID", NewAcqID()))...)
	require.ErrorIs(t, err, ErrArity)
	assert.Len(t, Args(Release, rel, A("token", "e:1"), A("acqID", "a"), Rest("e:2", "e:3")), 4+4)
	// Shifted: acqID and size swapped, the count right.
	acq := NewAcqID()
	args := []Arg{A("acqID", acq), A("size", 2), A("ttlMs", 1000), A("label", ""),
		A("blockMs", 0), A("graceMs", 100), A("tombMs", 100), A("phase", "fresh")}
	_, err = RunScript(ctx, nil, Acquire, Args(Acquire, append(keys, pend(acq)), args...)...)
	require.ErrorIs(t, err, ErrArity)
	assert.ErrorContains(t, err, `argument 1 is "size", called as "acqID"`)
	// Optional ones: any first few, in order.
	args[0], args[1] = A("size", 2), A("acqID", acq)
	for _, tail := range [][]Arg{nil, {A("sizeMode", "fixed")}, {A("sizeMode", "fixed"), A("idleMs", 0)}} {
		all := Args(Acquire, append(keys, pend(acq)), append(args, tail...)...)
		assert.Len(t, all, 6+8+len(tail), "nothing appended to refuse the call")
	}
	_, err = RunScript(ctx, nil, Acquire, Args(Acquire, append(keys, pend(acq)), append(args, A("idleMs", 0))...)...)
	require.ErrorIs(t, err, ErrArity, "idleMs without sizeMode")
}

// headerArgs returns how many arguments lua/<file> takes by its "-- ARGV:"
// header (argHeader): the names from "and optionally" on may be left
// out, from the last (max counts them, min does not); with a "then" item,
// any number may follow (max is Variadic).
func headerArgs(file string) (min, max int, err error) {
	h, err := argHeader(file, part(file))
	if err != nil {
		return 0, 0, err
	}
	min, max = h.Required, len(h.Names)
	if h.Rest {
		max = Variadic
	}
	return min, max, nil
}

// headerKeys returns the key names that lua/<file> lists on its
// "-- KEYS:" header line (a note in parentheses after a name is dropped),
// or an error when it has none.
func headerKeys(file string) ([]string, error) {
	for _, line := range strings.Split(part(file), "\n") {
		rest, ok := strings.CutPrefix(line, "-- KEYS:")
		if !ok {
			continue
		}
		var names []string
		for _, name := range headerNames(rest) {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
	return nil, fmt.Errorf("%s has no \"-- KEYS:\" header", file)
}

// declarations returns every script NewScript has made so far, in order.
func declarations() []Declaration {
	declMu.Lock()
	defer declMu.Unlock()
	return append([]Declaration(nil), declared...)
}

// A fast path's own headers are its script's: a reader of acquire_fast.lua
// or release_fast.lua needs no other file to know what it takes and returns.
func TestFastPathHeaders(t *testing.T) {
	for fast, script := range map[string]string{"acquire_fast.lua": "acquire.lua", "release_fast.lua": "release.lua"} {
		fk, err := headerKeys(fast)
		require.NoError(t, err)
		sk, err := headerKeys(script)
		require.NoError(t, err)
		assert.Equal(t, sk, fk, "%s's KEYS header", fast)
		fa, err := argHeader(fast, part(fast))
		require.NoError(t, err)
		sa, err := argHeader(script, part(script))
		require.NoError(t, err)
		assert.Equal(t, sa, fa, "%s's ARGV header", fast)
	}
}
