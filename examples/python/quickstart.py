from tether_sandbox import Sandbox  # TETHER_RELAY / TETHER_TOKEN, or relay=, token=

with Sandbox.get_or_create({"thread": "42"}, ttl=1800) as sb:
    r = sb.commands.run("echo hi; echo oops >&2; exit 3")
    print(r.stdout, r.stderr, r.exit_code)                           # 'hi\n' 'oops\n' 3
    sb.files.write("/workspace/app.py", "print(6 * 7)\n")
    print(sb.commands.run(["python3", "/workspace/app.py"]).stdout)  # 42
    with sb.code_session() as py:                                    # state survives between runs
        py.run("x = 21")
        print(py.run("x * 2").value)                                 # '42'
