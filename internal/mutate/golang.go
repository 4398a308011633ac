package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
)

// goMutants returns every mutant of the Go source src of file, found with
// go/ast and applied to the text at the nodes' offsets (so the rest of the
// file, comments and layout included, stays as it is).
func goMutants(file, src string) ([]mutant, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var ms []mutant
	add := func(at token.Pos, op string, start, end token.Pos, repl string) {
		p := fset.Position(at)
		ms = append(ms, mutant{ID: fmt.Sprintf("%s:%d:%d:%s", file, p.Line, p.Column, op), File: file,
			Start: fset.Position(start).Offset, End: fset.Position(end).Offset, New: repl})
	}
	opEnd := func(pos token.Pos, op token.Token) token.Pos { return pos + token.Pos(len(op.String())) }
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BinaryExpr:
			end := opEnd(n.OpPos, n.Op)
			switch n.Op {
			case token.LSS, token.LEQ, token.GTR, token.GEQ, token.EQL, token.NEQ:
				from := n.Op.String()
				if from == "!=" {
					from = "~="
				}
				for _, to := range relTo[from] {
					name := relName[to]
					if to == "~=" {
						to = "!="
					}
					add(n.OpPos, relName[from]+"2"+name, n.OpPos, end, to)
				}
			case token.LAND:
				add(n.OpPos, "and2or", n.OpPos, end, "||")
			case token.LOR:
				add(n.OpPos, "or2and", n.OpPos, end, "&&")
			case token.ADD, token.SUB:
				if isString(n.X) || isString(n.Y) {
					break // string concatenation
				}
				to, op := "-", "add2sub"
				if n.Op == token.SUB {
					to, op = "+", "sub2add"
				}
				add(n.OpPos, op, n.OpPos, end, to)
			}
		case *ast.AssignStmt:
			if n.Tok == token.ADD_ASSIGN || n.Tok == token.SUB_ASSIGN {
				to, op := "-=", "add2sub"
				if n.Tok == token.SUB_ASSIGN {
					to, op = "+=", "sub2add"
				}
				add(n.TokPos, op, n.TokPos, opEnd(n.TokPos, n.Tok), to)
			}
		case *ast.UnaryExpr:
			if n.Op == token.NOT {
				add(n.OpPos, "notdel", n.OpPos, n.OpPos+1, "")
			}
		case *ast.BasicLit:
			if v, err := strconv.Atoi(n.Value); err == nil && n.Kind == token.INT {
				add(n.Pos(), "inc", n.Pos(), n.End(), strconv.Itoa(v+1))
				dec := strconv.Itoa(v - 1)
				if v == 0 {
					dec = "(-1)"
				}
				add(n.Pos(), "dec", n.Pos(), n.End(), dec)
			}
		case *ast.IfStmt:
			add(n.Cond.Pos(), "iftrue", n.Cond.Pos(), n.Cond.End(), "true")
			add(n.Cond.Pos(), "iffalse", n.Cond.Pos(), n.Cond.End(), "false")
			if e, ok := n.Else.(*ast.BlockStmt); ok {
				a := src[fset.Position(n.Body.Pos()).Offset:fset.Position(n.Body.End()).Offset]
				b := src[fset.Position(e.Pos()).Offset:fset.Position(e.End()).Offset]
				add(n.Pos(), "swap", n.Body.Pos(), e.End(), b+" else "+a)
			}
		}
		return true
	})
	return ms, nil
}

func isString(e ast.Expr) bool {
	l, ok := e.(*ast.BasicLit)
	return ok && l.Kind == token.STRING
}
