//go:build unix

package main

import (
	"context"
	"fmt"
	"io"

	"github.com/redsem/redsem/admin"
)

const reclaimHelp = `Usage: redsem reclaim [connection flags] NAME

Gives back the slots of expired leases of semaphore (or mutex) NAME (holders
that died without releasing) and of waits that never completed, and prints
how many. Never required: every acquire does the same, and waiters wake up
for it. A read-write lock's expired leases go at its next lock, and a rate
gate's starts leave its window by themselves: reclaim refuses them (exit
65). A NAME that does not exist exits 66.

` + connHelp + `
Example:
  redsem reclaim nightly-backup
`

func cmdReclaim(args []string, stdout, _ io.Writer) error {
	return adminCommand("reclaim", reclaimHelp, args, 1, nil, func(ctx context.Context, n *named, _ []string) error {
		switch {
		case n.has(admin.KindSemaphore):
		case n.has(admin.KindRWMutex):
			return notFor("reclaim", n.name, admin.KindRWMutex, "its expired leases go at its next lock or unlock; reclaim applies to a semaphore or mutex")
		case n.has(admin.KindRate):
			return notFor("reclaim", n.name, admin.KindRate, "its starts leave the window by themselves; reclaim applies to a semaphore or mutex")
		case n.has(admin.KindElection):
			return notFor("reclaim", n.name, admin.KindElection, "a dead leader's seat goes at the next campaign or observer's read; reclaim applies to a semaphore or mutex")
		default:
			return n.noSuchName(ctx, "reclaim")
		}
		got, err := n.adm.Reclaim(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "reclaimed %d slot(s) of %q\n", got, n.name)
		return nil
	})
}
