module github.com/hearth-dev/hearth

go 1.26.8
