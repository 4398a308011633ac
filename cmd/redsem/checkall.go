//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/admin"
)

const checkAllHelp = `Usage: redsem check --all [--limit N] [--max-scan N] [--timeout D] [connection flags]

Checks every semaphore (and mutex) under the prefix, found by SCAN over their
meta keys, as "redsem check NAME" does, and prints one line for each one that
is unhealthy: slots missing or duplicated, stray tokens, or keys that cannot
be read. Prints nothing when all are healthy, so it suits cron. Exits 0 when
all are healthy, 65 when any is not. Rate gates are not checked.

  --all            check every semaphore under --prefix
  --limit N        check at most N names (default 1000); when more exist a
                   line on stderr says so
  --max-scan N     send at most N SCAN calls (COUNT 500) to find them (default
                   100); when that cuts the scan short a line on stderr says so
  --timeout D      bound on the whole check (default 60s)

` + connHelp + `
Example:
  */10 * * * *  redsem check --all --prefix redsem: || mail -s "redsem" ops@example.com
`

// wantsCheckAll reports whether check's arguments hold --all (before any
// "--").
func wantsCheckAll(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--all", "-all", "--all=true", "-all=true":
			return true
		}
	}
	return false
}

// cmdCheckAll is "redsem check --all".
func cmdCheckAll(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("check")
	var c connFlags
	c.register(fs)
	fs.Bool("all", false, "")
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
		return usagef("check: --timeout must be positive")
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
	total, unhealthy := 0, 0
	for _, f := range names.Found {
		if f.Kind != admin.KindSemaphore {
			continue
		}
		total++
		adm, err := admin.New(p.main, c.prefix, f.Name)
		if err != nil {
			return err
		}
		inv, err := adm.Check(ctx)
		switch {
		case errors.Is(err, redsem.ErrWrongType) || errors.Is(err, redsem.ErrCorrupt):
			unhealthy++
			fmt.Fprintf(stdout, "%q: cannot check: %v\n", f.Name, oneLine(err))
			continue
		case err != nil:
			return err
		}
		if inv.Exists && !inv.Healthy() {
			unhealthy++
			fmt.Fprintf(stdout, "%q: size %d, free %d, pending %d, leased %d, withheld %d, retired %d, duplicates %d, strangers %d, missing %v\n",
				f.Name, inv.Size, len(inv.Free), len(inv.Pending), len(inv.Leased), len(inv.Withheld), len(inv.Retired),
				len(inv.Duplicates), len(inv.Strangers), inv.Missing)
		}
	}
	if names.Truncated {
		fmt.Fprintf(stderr, "redsem: check --all: checked %d names under %q only; more may exist (raise --limit %d or --max-scan %d)\n",
			len(names.Found), c.prefix, *limit, *maxScan)
	}
	if unhealthy > 0 {
		return exitf(exitData, "check --all: %d of %d semaphores under %q unhealthy", unhealthy, total, c.prefix)
	}
	return nil
}

// oneLine flattens an error message onto one line.
func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }
