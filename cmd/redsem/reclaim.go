//go:build unix

package main

import (
	"context"
	"fmt"
	"io"

	"github.com/redsem/redsem/admin"
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
	return adminCommand("reclaim", reclaimHelp, args, 1, nil, func(ctx context.Context, adm *admin.Handle, pos []string) error {
		n, err := adm.Reclaim(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "reclaimed %d slot(s) of %q\n", n, pos[0])
		return nil
	})
}
