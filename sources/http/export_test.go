package http

import "bytes"

// Pointer is PointerReader over a document in memory, as the tests write them.
func Pointer(doc []byte, ptr string) ([]byte, error) {
	return PointerReader(bytes.NewReader(doc), ptr)
}
