from benchmarks import audit_speed, engine

print(engine.run())
print()
print(audit_speed.run())
