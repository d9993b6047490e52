"""The macros the OpenCL C specification has every compiler define (its sections on macros,
numeric limits and math constants), for conveyor's reading of a kernel source.

conveyor preprocesses a source with the macros it knows (``Device.source_macros``) to read
its parameters. A kernel inside ``#ifdef CLK_LOCAL_MEM_FENCE`` (or a type chosen by
``#if INT_MAX > 40000``) was missing from that reading: conveyor fell back to the raw text,
where a typedef with two branches is no type at all, and refused a legal kernel (round
twenty-three). The values are the specification's, as tokens a preprocessor's ``#if`` reads;
the floating ones only need to be defined (``#if`` takes no floats).
"""

from __future__ import annotations

_LIMITS = {
    "CHAR_BIT": "8", "SCHAR_MAX": "127", "SCHAR_MIN": "(-127-1)", "CHAR_MAX": "127",
    "CHAR_MIN": "(-127-1)", "UCHAR_MAX": "255", "SHRT_MAX": "32767", "SHRT_MIN": "(-32767-1)",
    "USHRT_MAX": "65535", "INT_MAX": "2147483647", "INT_MIN": "(-2147483647-1)",
    "UINT_MAX": "0xffffffff", "LONG_MAX": "0x7fffffffffffffffL",
    "LONG_MIN": "(-0x7fffffffffffffffL-1)", "ULONG_MAX": "0xffffffffffffffffUL",
    "FLT_DIG": "6", "FLT_MANT_DIG": "24", "FLT_MAX_10_EXP": "38", "FLT_MAX_EXP": "128",
    "FLT_MIN_10_EXP": "(-37)", "FLT_MIN_EXP": "(-125)", "FLT_RADIX": "2",
    "FLT_MAX": "0x1.fffffep127f", "FLT_MIN": "0x1.0p-126f", "FLT_EPSILON": "0x1.0p-23f",
    "DBL_DIG": "15", "DBL_MANT_DIG": "53", "DBL_MAX_10_EXP": "308", "DBL_MAX_EXP": "1024",
    "DBL_MIN_10_EXP": "(-307)", "DBL_MIN_EXP": "(-1021)", "DBL_MAX": "0x1.fffffffffffffp1023",
    "DBL_MIN": "0x1.0p-1022", "DBL_EPSILON": "0x1.0p-52",
    "MAXFLOAT": "0x1.fffffep127f", "HUGE_VALF": "(1.0f/0.0f)", "HUGE_VAL": "(1.0/0.0)",
    "INFINITY": "(1.0f/0.0f)", "NAN": "(0.0f/0.0f)",
    "CLK_LOCAL_MEM_FENCE": "1", "CLK_GLOBAL_MEM_FENCE": "2", "CLK_IMAGE_MEM_FENCE": "4",
}  # fmt: skip

_CONSTANTS = {
    "M_E": "2.718281828459045", "M_LOG2E": "1.4426950408889634",
    "M_LOG10E": "0.4342944819032518", "M_LN2": "0.6931471805599453",
    "M_LN10": "2.302585092994046", "M_PI": "3.141592653589793", "M_PI_2": "1.5707963267948966",
    "M_PI_4": "0.7853981633974483", "M_1_PI": "0.3183098861837907",
    "M_2_PI": "0.6366197723675814", "M_2_SQRTPI": "1.1283791670955126",
    "M_SQRT2": "1.4142135623730951", "M_SQRT1_2": "0.7071067811865476",
}  # fmt: skip


def predefined() -> dict[str, str]:
    """Every macro of the specification's lists: limits, fences, and each math constant in
    its double and float (``_F``) spelling."""
    macros = dict(_LIMITS)
    for name, value in _CONSTANTS.items():
        macros[name] = value
        macros[f"{name}_F"] = f"{value}f"
    return macros
