//go:build unix && !linux

package main

import "os"

// keysMode leaves the terminal as it is here: q then quits top once Enter
// follows it.
func keysMode(*os.File) (restore func()) { return func() {} }
