//go:build unix && !linux

package main

import "io"

// termRows returns the height of the terminal w is, or 0 when unknown (here
// always: the view is then not cut to the screen).
func termRows(io.Writer) int { return 0 }
