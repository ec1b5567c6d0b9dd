-- KEYS fence; ARGV epoch. See lib_raise.lua.
return hearth_raise()
