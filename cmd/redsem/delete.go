//go:build unix

package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/redsem/redsem/admin"
)

const deleteHelp = `Usage: redsem delete --force [connection flags] NAME

Removes every key of semaphore NAME. Current holders lose their leases at
their next refresh (a redsem run holder then stops its command and exits 75);
blocked waiters keep waiting and are served by the semaphore the next acquire
creates afresh. To change a semaphore's size, use redsem resize instead.

  --force          required: without it, delete only says what it would remove
                   (and exits 64 when there is something to remove)

A semaphore that does not exist is not an error, with or without --force:
delete says so and exits 0, since what delete is for (no semaphore NAME)
already holds; cleanup scripts can run it twice.

` + connHelp + `
Example:
  redsem delete --force encoders
`

func cmdDelete(args []string, stdout, _ io.Writer) error {
	var force *bool
	flags := func(fs *flag.FlagSet) { force = fs.Bool("force", false, "") }
	return adminCommand("delete", deleteHelp, args, 1, flags, func(ctx context.Context, adm *admin.Handle, pos []string) error {
		name := pos[0]
		st, err := adm.Status(ctx)
		if err != nil {
			return err
		}
		if !*force {
			if !st.Exists {
				fmt.Fprintf(stdout, "semaphore %q does not exist; nothing to delete\n", name)
				return nil
			}
			return usagef("delete: semaphore %q (size %d) has %d holder(s) and %d waiter(s); add --force to delete it",
				name, st.Size, len(st.Holders), st.Waiting)
		}
		// Delete even what Status does not count as a semaphore (a waits
		// key left by waiters of a deleted one).
		if err := adm.Delete(ctx); err != nil {
			return err
		}
		if !st.Exists {
			fmt.Fprintf(stdout, "semaphore %q does not exist; nothing to delete\n", name)
			return nil
		}
		fmt.Fprintf(stdout, "deleted %q\n", name)
		return nil
	})
}
