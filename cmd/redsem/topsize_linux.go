//go:build linux

package main

import (
	"io"
	"os"
	"syscall"
	"unsafe"
)

// termSize returns the height and width of the terminal w is, or zeros
// when unknown.
func termSize(w io.Writer) (rows, cols int) {
	f, ok := w.(*os.File)
	if !ok {
		return 0, 0
	}
	var ws struct{ rows, cols, x, y uint16 }
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&ws)))
	if errno != 0 {
		return 0, 0
	}
	return int(ws.rows), int(ws.cols)
}
