//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
)

const reclaimHelp = `Usage: redsem reclaim [connection flags] NAME

Gives back the slots of expired leases of semaphore NAME (holders that died
without releasing) and of waits that never completed, and prints how many.
Never required: every acquire does the same, and waiters wake up for it.

` + connHelp + `
Example:
  redsem reclaim nightly-backup
`

func cmdReclaim(args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("reclaim")
	var c connFlags
	c.register(fs)
	pos, err := parseArgs(fs, args, reclaimHelp)
	if err != nil {
		return err
	}
	name, err := oneName("reclaim", pos)
	if err != nil {
		return err
	}
	sem, p, err := openSemaphore(c, name)
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	n, err := sem.Reclaim(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "reclaimed %d slot(s) of %q\n", n, name)
	return nil
}
