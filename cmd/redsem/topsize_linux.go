//go:build linux

package main

import (
	"io"
	"os"
	"syscall"
	"unsafe"
)

// termRows returns the height of the terminal w is, or 0 when unknown.
func termRows(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok {
		return 0
	}
	var ws struct{ rows, cols, x, y uint16 }
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&ws)))
	if errno != 0 {
		return 0
	}
	return int(ws.rows)
}
