//go:build unix

package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/redsem/redsem"
)

const deleteHelp = `Usage: redsem delete --force [connection flags] NAME

Removes every key of semaphore NAME. Current holders lose their leases at
their next refresh (a redsem run holder then stops its command and exits 75);
blocked waiters keep waiting and are served by the semaphore the next acquire
creates afresh. To change a semaphore's size, use redsem resize instead.

  --force          required: without it, delete only says what it would remove

` + connHelp + `
Example:
  redsem delete --force encoders
`

func cmdDelete(args []string, stdout, _ io.Writer) error {
	var force *bool
	flags := func(fs *flag.FlagSet) { force = fs.Bool("force", false, "") }
	return adminCommand("delete", deleteHelp, args, 1, flags, func(ctx context.Context, sem *redsem.Semaphore, pos []string) error {
		name := pos[0]
		if !*force {
			st, err := sem.Status(ctx)
			if err != nil {
				return err
			}
			if !st.Exists {
				return usagef("delete: semaphore %q does not exist; nothing to delete", name)
			}
			return usagef("delete: semaphore %q (size %d) has %d holder(s) and %d waiter(s); add --force to delete it",
				name, st.Size, len(st.Holders), st.Waiting)
		}
		if err := sem.Delete(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "deleted %q\n", name)
		return nil
	})
}
