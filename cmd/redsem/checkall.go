//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gomodule/redigo/redis"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
)

const checkAllHelp = `Usage: redsem check --all [-v] [--json] [--limit N] [--max-scan N] [--timeout D] [connection flags]

Checks every name under the prefix, found by SCAN over their meta keys, as
"redsem check NAME" does for its kind (semaphore, mutex, read-write lock,
rate gate), and prints one line for each one that is unhealthy: slots
missing or duplicated, stray tokens or grant-log entries, or keys that
cannot be read. Prints nothing when all are healthy, so it suits cron (-v
says how many were checked). Exits 0 when all are healthy, 65 when any is
not.

  --all            check every name under --prefix
  --json           print one JSON report: "prefix", "checked", "healthy",
                   "truncated" and "unhealthy" (the check --json document of
                   each unhealthy name; one that cannot be read has "error")
  --limit N        check at most N names (default 1000); when more exist a
                   line on stderr says so
  --max-scan N     send at most N SCAN calls (COUNT 500) to find them (default
                   100); when that cuts the scan short a line on stderr says so
  --timeout D      bound on the whole check (default 60s)
  -v, --verbose    when all are healthy, say how many names were checked

` + connHelp + `
Example:
  */10 * * * *  redsem check --all --prefix redsem: || mail -s "redsem" ops@example.com
`

// wantsFlag reports whether check's arguments hold the boolean flag
// --name (before any "--"): --all and --server pick another command.
func wantsFlag(args []string, name string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--" + name, "-" + name, "--" + name + "=true", "-" + name + "=true":
			return true
		}
	}
	return false
}

// checkAllJSON is check --all --json.
type checkAllJSON struct {
	Prefix    string `json:"prefix"`
	Checked   int    `json:"checked"`
	Healthy   bool   `json:"healthy"`
	Truncated bool   `json:"truncated"`
	Unhealthy []any  `json:"unhealthy"`
}

// unreadableJSON is a name check --all could not read.
type unreadableJSON struct {
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Exists  bool   `json:"exists"`
	Healthy bool   `json:"healthy"`
	Error   string `json:"error"`
}

// cmdCheckAll is "redsem check --all".
func cmdCheckAll(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("check")
	var c connFlags
	c.register(fs)
	fs.Bool("all", false, "")
	asJSON := fs.Bool("json", false, "")
	verbose := fs.Bool("v", false, "")
	fs.BoolVar(verbose, "verbose", false, "")
	limit := fs.Int("limit", admin.DefaultScanLimit, "")
	maxScan := fs.Int("max-scan", admin.DefaultMaxScan, "")
	timeout := durationValue{d: time.Minute}
	fs.Var(&timeout, "timeout", "")
	pos, err := parseArgs(fs, args, checkAllHelp)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("check: --all takes no NAME, got %q", strings.Join(pos, " "))
	}
	if *limit < 1 {
		return usagef("check: --limit must be at least 1, not %d", *limit)
	}
	if *maxScan < 1 {
		return usagef("check: --max-scan must be at least 1, not %d", *maxScan)
	}
	if timeout.d <= 0 {
		return usagef("check: --timeout must be positive, not %s", timeout.String())
	}
	p, err := connect(c)
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout.d)
	defer cancel()
	names, err := admin.ScanNames(ctx, p.main, c.prefix, admin.ScanLimits{Limit: *limit, MaxScan: *maxScan})
	if err != nil {
		return err
	}
	report := checkAllJSON{Prefix: c.prefix, Truncated: names.Truncated, Unhealthy: []any{}}
	for _, f := range names.Found {
		adm, err := admin.New(p.main, c.prefix, f.Name)
		if err != nil {
			return err
		}
		n := &named{adm: adm, pool: p.main, prefix: c.prefix, name: f.Name, kinds: []admin.Kind{f.Kind}}
		res, err := checkKind(ctx, n, f.Kind)
		switch {
		case errors.Is(err, redsem.ErrWrongType) || errors.Is(err, redsem.ErrCorrupt) || engineRedisError(err):
			report.Checked++
			report.Unhealthy = append(report.Unhealthy, unreadableJSON{Kind: string(f.Kind), Name: f.Name, Exists: true, Error: oneLine(err)})
			if !*asJSON {
				fmt.Fprintf(stdout, "%q: %s: cannot check: %v\n", f.Name, f.Kind, oneLine(err))
			}
			continue
		case err != nil:
			return err
		}
		if notThere(res.doc) {
			continue // deleted since the scan
		}
		report.Checked++
		if !res.healthy {
			report.Unhealthy = append(report.Unhealthy, res.doc)
			if !*asJSON {
				fmt.Fprintln(stdout, res.line)
			}
		}
	}
	report.Healthy = len(report.Unhealthy) == 0
	if *asJSON {
		if err := writeJSON(stdout, report); err != nil {
			return err
		}
	}
	if names.Truncated {
		fmt.Fprintf(stderr, "redsem: check --all: checked %d names under %q only; more may exist (raise --limit %d or --max-scan %d)\n",
			len(names.Found), c.prefix, *limit, *maxScan)
	}
	if !report.Healthy {
		return exitf(exitData, "check --all: %d of %d names under %q unhealthy", len(report.Unhealthy), report.Checked, c.prefix)
	}
	if *verbose && !*asJSON {
		fmt.Fprintf(stdout, "%s under %q checked, all healthy\n", plural(report.Checked, "name", "names"), c.prefix)
	}
	return nil
}

// notThere reports whether a check document is of a name that no longer
// exists.
func notThere(doc any) bool {
	switch d := doc.(type) {
	case checkJSON:
		return !d.Exists
	case rwCheckJSON:
		return !d.Exists
	case rateCheckJSON:
		return !d.Exists
	case electionJSON:
		return !d.Exists
	}
	return false
}

// engineRedisError reports whether err is Redis's error reply about one
// name's keys (as admin.ReadFleet counts it), not a failed connection.
func engineRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// oneLine flattens an error message onto one line.
func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

// plural writes n with the singular or plural noun: "1 name", "24 names".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
