from benchmarks import architectures, audit_speed, engine

print(engine.run())
print()
print(audit_speed.run())
print()
print(architectures.run())
