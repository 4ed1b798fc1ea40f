// The request counts of a local Kafka broker, by API, read over JMX.
//
// java benchmarks/java/BrokerRequests.java <pid>
//
// Attaches to the broker's JVM (same user, same host; no JMX port needed),
// then prints one line of JSON, {"Produce": 123, "Fetch": 45, ...}: the
// cumulative count of kafka.network:type=RequestMetrics,name=RequestsPerSec
// of every request type, each time it reads a line on stdin, until stdin
// closes. Used by benchmarks/broker_probe.py (BrokerRequests).
import com.sun.tools.attach.VirtualMachine;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Map;
import java.util.TreeMap;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class BrokerRequests {
  public static void main(String[] args) throws Exception {
    VirtualMachine vm = VirtualMachine.attach(args[0]);
    String url = vm.startLocalManagementAgent();
    vm.detach();
    MBeanServerConnection jmx =
        JMXConnectorFactory.connect(new JMXServiceURL(url)).getMBeanServerConnection();
    ObjectName pattern =
        new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,*");
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    System.out.println("{}");  // ready
    System.out.flush();
    while (in.readLine() != null) {
      Map<String, Long> counts = new TreeMap<>();
      for (ObjectName name : jmx.queryNames(pattern, null)) {
        long count = ((Number) jmx.getAttribute(name, "Count")).longValue();
        counts.merge(name.getKeyProperty("request"), count, Long::sum);
      }
      StringBuilder line = new StringBuilder("{");
      for (Map.Entry<String, Long> e : counts.entrySet()) {
        if (line.length() > 1) line.append(", ");
        line.append('"').append(e.getKey()).append("\": ").append(e.getValue());
      }
      System.out.println(line.append('}'));
      System.out.flush();
    }
  }
}
